"""Names and file operations of `RUN_DIR/checkpoints/`, and the rule for "complete".

```
checkpoints/
  step-200/            complete: DCP shards + .metadata + ditty_state.json + COMPLETE
  .tmp-step-300/       a save in progress (or one that died); never resumed from
  .trash-step-100-*/   an old checkpoint being deleted (renamed first, so a crash mid-delete
                       cannot leave a dir that still looks complete)
  latest               text "step-200", written last
```
A directory counts as complete only with DCP's `.metadata`, ditty's sidecar and the `COMPLETE`
marker, which is written after both; the rename into `step-N` is the commit.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

CHECKPOINTS = "checkpoints"
METADATA = ".metadata"
SIDECAR = "ditty_state.json"
MARKER = "COMPLETE"
LATEST = "latest"

_STEP_RE = re.compile(r"^step-(\d+)$")
_TMP_RE = re.compile(r"^\.tmp-step-(\d+)$")


def step_name(step: int) -> str:
    return f"step-{step}"


def tmp_name(step: int) -> str:
    return f".tmp-step-{step}"


def step_of(path: Path) -> int | None:
    m = _STEP_RE.match(path.name)
    return int(m.group(1)) if m else None


def is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in (METADATA, SIDECAR, MARKER))


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """`step-N` directories under `root`, newest first (complete or not)."""
    if not root.is_dir():
        return []
    found = [(step_of(p), p) for p in root.iterdir() if p.is_dir()]
    return sorted(((s, p) for s, p in found if s is not None), reverse=True)


def tmp_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(_TMP_RE.match(p.name), p) for p in root.iterdir() if p.is_dir()]
    return sorted(((int(m.group(1)), p) for m, p in found if m), reverse=True)


def fsync_dir(path: Path) -> None:
    # Makes a rename or a new file durable across a power loss (not just a crash); one syscall.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (network mounts) refuse fsync on directories
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Readers see the old content or the new one, never a torn file (temp file + os.replace)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def remove_dir(path: Path) -> None:
    """Rename out of sight first, then delete: a crash halfway leaves only a `.trash-*` dir."""
    trash = path.with_name(f".trash-{path.name}-{uuid.uuid4().hex[:8]}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def remove_stale(root: Path, keep: Path) -> None:
    """Drop leftovers of saves that died (`.tmp-step-*`) and of interrupted deletes (`.trash-*`)."""
    for p in root.iterdir():
        if p != keep and p.is_dir() and (p.name.startswith(".tmp-step-") or p.name.startswith(".trash-")):
            shutil.rmtree(p, ignore_errors=True)
