"""Rank and world-size queries that work with or without an initialised process group."""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import torch

TIMEOUT_ENV = "DITTY_DIST_TIMEOUT_S"
# A collective waits this long for a peer before it raises. torch's own default for gloo is 30
# minutes; ten is long enough for a slow checkpoint write on rank 0 while the others wait, and short
# enough that a peer lost without torchrun noticing (another node) ends the run the same hour.
DEFAULT_TIMEOUT_S = 600.0


def configured_timeout() -> datetime.timedelta:
    """How long a collective waits for a peer: $DITTY_DIST_TIMEOUT_S, else DEFAULT_TIMEOUT_S. Every
    process group ditty makes takes it (torch's own default for a new gloo group is 30 minutes)."""
    return datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))


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


# --- ranks that read the same batches -----------------------------------------------------------
# The ranks of one tensor-parallel group compute each forward together, so they must be given the
# same batches; evaluation splits its sets over the world divided into such groups. The runtime
# (ditty.parallel.runtime) sets the group size when it builds the mesh, and resets it at teardown.
_BATCH_REPLICAS = [1]


def set_batch_replicas(size: int) -> None:
    _BATCH_REPLICAS[0] = max(1, int(size))


def batch_shard() -> tuple[int, int]:
    """(this rank's index, how many) among the groups of ranks that read different batches:
    (rank, world size) unless tensor parallel groups ranks (consecutive ranks, the innermost mesh
    dimension)."""
    replicas = _BATCH_REPLICAS[0]
    return rank() // replicas, max(1, world_size() // replicas)


# --- errors in launched workers -----------------------------------------------------------------
# torchrun reports a worker that exits 2 as a generic failure (exit 1, its own traceback), and when
# one rank crashes its peers fail too (a collective loses its peer), so which rank started it is
# unclear. The launcher (ditty.parallel.launch) names a directory in this variable; a worker that
# hits a user error writes its short message there, one that crashes writes a timestamped line, and
# the launcher prints the user error (exit 2) or names the rank that failed first (exit 1).
ERROR_DIR_ENV = "DITTY_ERROR_DIR"


def record_user_error(message: str) -> None:
    """Leave a worker's user-error message for the launcher; a no-op outside `ditty.parallel.launch`
    (checked first: asking for the rank imports torch, seconds that a mistyped flag should not cost)."""
    if os.environ.get(ERROR_DIR_ENV):
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


# --- rank 0 decides, every rank learns ----------------------------------------------------------
# Several builders let rank 0 read or decide something (a checkpoint's layout, a model skeleton) and
# send it to the others. An exception travels like any value, so a failure on one rank ends every
# rank with the same error instead of leaving the others waiting in the next collective.


def share_from_rank0(value: Any) -> Any:
    """Rank 0's `value` on every rank (one `broadcast_object_list`; the value itself on one process).
    An exception that cannot be pickled travels as a RuntimeError with its text."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [portable_error(value) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return value if dist.get_rank() == 0 else box[0]


def on_every_rank(flag: bool) -> bool:
    """Whether `flag` holds on every rank (the flag itself on one process): for a choice between paths
    that run different collectives, which every rank must then take alike."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(flag))
    return all(flags)


def portable_error(value: Any) -> Any:
    """`value`, with an exception that does not pickle replaced by a RuntimeError with its text (for
    object collectives; RecipeError pickles from its fields)."""
    if isinstance(value, BaseException):
        import pickle

        try:
            pickle.loads(pickle.dumps(value))
        except Exception:  # noqa: BLE001 - any unpicklable error still reaches the other ranks
            return RuntimeError(f"{type(value).__name__}: {value}")
    return value


def raise_on_every_rank(error: Optional[BaseException], what: str) -> None:
    """All ranks learn whether any rank failed (one all_gather_object); all raise the first failure.
    `what` says what the ranks were doing, for a failure that arrives only as text."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        if error is not None:
            raise error
        return
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, None if error is None else portable_error(error))
    for failed_rank, failure in enumerate(errors):
        if failure is None:
            continue
        if error is not None:
            raise error
        if isinstance(failure, BaseException):
            raise failure
        raise RuntimeError(f"rank {failed_rank} failed while {what}: {failure}")


def all_reduce_sum(t: "torch.Tensor", group: Any = None) -> "torch.Tensor":
    """Sum across ranks (a no-op on one process): the whole world, or `group` (under tensor parallel,
    the ranks that hold different tokens: `Runtime.batch_group`). Cost: one collective, no host sync."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t
