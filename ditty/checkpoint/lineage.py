"""Which run a directory and a checkpoint belong to.

Every run gets a run id when it starts afresh (a random UUID), kept in `env.json` and in the
sidecar of each of its checkpoints, and carried over when it resumes. So a checkpoint named by
`checkpoint.resume = "OTHER/checkpoints/step-20"` can be told apart from the run a directory already
holds: resuming it is allowed into a new or empty directory (a new run, with a new id, starts
there from that checkpoint) or into the run that wrote it, never into another run's directory,
whose checkpoints, metrics and final/ the two runs would then share.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Optional

RUN_ID = "run_id"
ENV_FILE = "env.json"
LOCK_FILE = "run.lock"


def new_run_id() -> str:
    return uuid.uuid4().hex


def run_id_of(run_dir: str | os.PathLike) -> Optional[str]:
    """The run id `run_dir/env.json` records (None for a new directory or an older ditty's run)."""
    try:
        value = json.loads((Path(run_dir) / ENV_FILE).read_text(encoding="utf-8")).get(RUN_ID)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def is_new_or_empty(run_dir: str | os.PathLike) -> bool:
    """Absent, or empty but for a `run.lock` (the lock this very run may hold already)."""
    path = Path(run_dir)
    return not path.exists() or (path.is_dir() and all(p.name == LOCK_FILE for p in path.iterdir()))


def belongs_to(checkpoint: Path, run_dir: str | os.PathLike) -> bool:
    """Whether `checkpoint` lies inside `run_dir` (then it was written by the run there)."""
    try:
        checkpoint.resolve().relative_to(Path(run_dir).resolve())
    except ValueError:
        return False
    return True


def foreign_checkpoint(run_dir: str | os.PathLike, checkpoint: Path, sidecar: dict) -> Optional[str]:
    """Why resuming `checkpoint` into `run_dir` would mix two runs (None when it would not)."""
    if is_new_or_empty(run_dir) or belongs_to(checkpoint, run_dir):
        return None
    here, there = run_id_of(run_dir), sidecar.get(RUN_ID)
    if here is not None and here == there:
        return None  # the same run, moved or copied
    return (
        f"{run_dir} holds another run (run id {here or 'not recorded'}) than the one that wrote {checkpoint} "
        f"(run id {there or 'not recorded'}); resuming it there would mix the two runs' checkpoints, metrics and "
        "final/"
    )


def run_id_for(run_dir: str | os.PathLike, checkpoint: Optional[Path], sidecar: Optional[dict]) -> str:
    """The id of the run about to start in `run_dir`: the one it holds, else that of its own
    checkpoint being resumed, else a new one (a fresh start, or another run's checkpoint resumed)."""
    found = run_id_of(run_dir)
    if found is None and checkpoint is not None and sidecar and belongs_to(checkpoint, run_dir):
        found = sidecar.get(RUN_ID) if isinstance(sidecar.get(RUN_ID), str) else None
    return found or new_run_id()
