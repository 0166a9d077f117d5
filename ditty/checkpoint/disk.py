"""Disk space and write errors of saves: a full disk is said in those words, with what was kept.

Before each save, the free space of the checkpoint directory's filesystem is compared with what
the save needs (the larger of the last checkpoint's size and the bytes of the tensors about to be
written), so a save that cannot fit stops before it writes anything. A save that fails anyway
(another process filled the disk, a quota) is reported as "no space left on DEVICE (needed ~N MB)",
or as the operating system's error, never as the error of whichever library was writing: torch's
zip writer, for one, reports a full disk as "unexpected pos 704 vs 598" and drops the errno.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator, Optional

from ditty._utils.errors import RunFailure

SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
MARGIN = 1.05
"""Headroom over the estimate: the sidecar, the manifest and filesystem overhead."""
NEARLY_FULL_BYTES = 1 << 20
"""With less than this free after a failed write, the failure is taken to be the full disk."""


class CheckpointSaveError(RunFailure):
    """A save (a checkpoint or `final/`) could not be written; the message says what is kept."""


def mount_point(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists():
        path = path.parent
    while not os.path.ismount(path):
        path = path.parent
    return path


def device_name(path: Path) -> str:
    """`/mnt/data (/dev/sdb1)`: the mount point holding `path` and, from /proc/mounts, its device."""
    mount = mount_point(path)
    device = None
    try:
        with open("/proc/mounts", encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) >= 2 and fields[1] == str(mount):
                    device = fields[0]  # the last entry for a mount point is the one in effect
    except OSError:
        pass
    return f"{mount} ({device})" if device and device != str(mount) else str(mount)


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(mount_point(path)).free


def directory_bytes(path: Path) -> int:
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file():
                total += item.stat().st_size
        except OSError:
            continue
    return total


def megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count < 10e9 else f"{count / 1e9:.1f} GB"


def check_free_space(root: Path, needed: int, *, what: str, kept: Optional[str]) -> None:
    """Raise CheckpointSaveError before a save of `needed` bytes into `root` that cannot fit."""
    want = int(needed * MARGIN)
    free = free_bytes(root)
    if free < want:
        raise CheckpointSaveError(
            f"no space left on {device_name(root)} for {what} (needed ~{megabytes(want)}, {megabytes(free)} free); "
            f"nothing was written. {_kept(kept)}"
        )


def _kept(kept: Optional[str]) -> str:
    if kept:
        return (
            f"{kept} is intact: free some space (or move run.output_dir), then run the same command again "
            "to resume from it."
        )
    return "No earlier checkpoint exists: free some space (or choose another run.output_dir) and start again."


def _os_errors(error: BaseException) -> Iterator[OSError]:
    """OSErrors inside `error`: itself, its causes, and the per-rank failures DCP collects."""
    seen: set[int] = set()
    stack = [error]
    while stack:
        item = stack.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, OSError):
            yield item
        stack += [item.__cause__, item.__context__]
        failures = getattr(item, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):  # rank -> the exception, or (exception, its stack summary)
            for failure in failures.values():
                failure = failure[0] if isinstance(failure, tuple) and failure else failure
                if isinstance(failure, BaseException):
                    stack.append(failure)
        stack += [a for a in getattr(item, "args", ()) if isinstance(a, BaseException)]


def explain_write_error(
    error: BaseException, root: Path, needed: int, *, what: str, kept: Optional[str]
) -> Optional[CheckpointSaveError]:
    """A CheckpointSaveError for a failed write of `what` into `root`, or None when `error` is not a
    write error (a bug, to be raised as it is)."""
    os_errors = list(_os_errors(error))
    full = any(e.errno in SPACE_ERRNOS for e in os_errors)
    try:
        nearly_full = free_bytes(root) < max(NEARLY_FULL_BYTES, int(needed * 0.01))
    except OSError:
        nearly_full = False
    if full or (nearly_full and not os_errors):
        size = f" (needed ~{megabytes(int(needed * MARGIN))})" if needed else ""
        return CheckpointSaveError(
            f"no space left on {device_name(root)} while writing {what}{size}; "
            f"the partial files were removed. {_kept(kept)}"
        )
    if os_errors:
        first = os_errors[0]
        where = f" ({first.filename})" if first.filename else ""
        return CheckpointSaveError(
            f"could not write {what}: {first.strerror or first}{where}; the partial files were removed. {_kept(kept)}"
        )
    return None


@contextlib.contextmanager
def write_errors_reported(
    root: Path, needed: int, *, what: str, kept: Optional[str], cleanup: Optional[Path] = None
) -> Iterator[None]:
    """Turn a failed write inside the block into a CheckpointSaveError; remove `cleanup` first."""
    try:
        yield
    except (CheckpointSaveError, KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    # BaseException: torch.distributed.checkpoint's CheckpointException, which carries every rank's
    # error, derives from BaseException, not Exception.
    except BaseException as error:  # noqa: BLE001 - classified below; anything else is raised unchanged
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
        explained = explain_write_error(error, root, needed, what=what, kept=kept)
        if explained is None:
            raise
        raise explained from None
