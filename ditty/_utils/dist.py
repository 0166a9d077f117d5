"""Rank and world-size queries that work with or without an initialised process group."""

from __future__ import annotations

import os


def world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    return rank() == 0


# --- errors in launched workers -----------------------------------------------------------------
# torchrun reports a worker that exits 2 as a generic failure (exit 1, its own traceback), and when
# one rank crashes its peers fail too (a collective loses its peer), so which rank started it is
# unclear. The launcher (ditty.parallel.launch) names a directory in this variable; a worker that
# hits a user error writes its short message there, one that crashes writes a timestamped line, and
# the launcher prints the user error (exit 2) or names the rank that failed first (exit 1).
ERROR_DIR_ENV = "DITTY_ERROR_DIR"


def record_user_error(message: str) -> None:
    """Leave a worker's user-error message for the launcher; a no-op outside `ditty.parallel.launch`."""
    _leave(f"rank-{rank()}.txt", message)


STOP_FILE = "stopped-{rank}.txt"


def record_stop(message: str) -> None:
    """Leave word that this worker stopped on a signal after saving (the launcher then says no more)."""
    _leave(STOP_FILE.format(rank=rank()), message)


def record_failure(error: BaseException) -> None:
    """Leave when and how this worker crashed (call in the top-level except, then re-raise)."""
    import time

    summary = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    _leave(f"failure-{rank()}.txt", f"{time.time_ns()}\n{summary}")


def _leave(name: str, message: str) -> None:
    directory = os.environ.get(ERROR_DIR_ENV)
    if not directory:
        return
    path = os.path.join(directory, name)
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(message)
        os.replace(path + ".tmp", path)  # the launcher never reads half a message
    except OSError:
        pass  # the exit code 2 still reaches the launcher; only the text is lost
