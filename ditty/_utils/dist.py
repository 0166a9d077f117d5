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


# --- user errors in launched workers ------------------------------------------------------------
# torchrun reports a worker that exits 2 as a generic failure (exit 1, its own traceback). So the
# launcher (ditty.parallel.launch) names a directory in this variable, a worker that hits a user
# error writes its short message there, and the launcher prints it and exits 2.
ERROR_DIR_ENV = "DITTY_ERROR_DIR"


def record_user_error(message: str) -> None:
    """Leave a worker's user-error message for the launcher; a no-op outside `ditty.parallel.launch`."""
    directory = os.environ.get(ERROR_DIR_ENV)
    if not directory:
        return
    path = os.path.join(directory, f"rank-{rank()}.txt")
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(message)
        os.replace(path + ".tmp", path)  # the launcher never reads half a message
    except OSError:
        pass  # the exit code 2 still reaches the launcher; only the text is lost
