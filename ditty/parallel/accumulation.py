"""Gradient accumulation across micro-batches and ranks: when to reduce, and how to scale the loss.

DDP and FSDP reduce gradients with a MEAN over the data-parallel ranks. ditty's loss is a SUM over
the tokens of the whole global batch divided by the global token count (docs/ARCHITECTURE.md,
the flow), so each rank backwards `local_token_loss_sum / global_tokens` and the gradient it needs
is the SUM of those over ranks; the mean divides it by the world size once too often.
`grad_average_correction` is the factor that undoes it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn


def grad_average_correction(data_parallel_size: int) -> float:
    """Multiply the per-rank loss (already divided by the global token count) by this before backward.

    With it, N ranks holding parts of a global batch produce the same gradient as 1 rank holding all
    of it. (FSDP2 could instead be told `set_gradient_divide_factor(1.0)`; DDP cannot, so one rule
    for both.)
    """
    if data_parallel_size < 1:
        raise ValueError(f"data_parallel_size must be at least 1, got {data_parallel_size}")
    return float(data_parallel_size)


def _is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _is_ddp(model: nn.Module) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)


@contextlib.contextmanager
def no_sync_context(model: nn.Module, is_last_micro_batch: bool, sync_grad_accum: bool = False) -> Iterator[None]:
    """Wrap one micro-batch's forward AND backward: gradients are reduced only on the last one.

    DDP: `model.no_sync()` on the others. FSDP2: `set_requires_gradient_sync(False)` on the others
    (the unsharded gradients then accumulate locally: memory of one full gradient per block, paid to
    save one reduce-scatter per micro-batch), restored on exit. `sync_grad_accum` reduces on every
    micro-batch instead. Any other model: no effect.
    """
    if is_last_micro_batch or sync_grad_accum:
        yield
        return
    if _is_ddp(model):
        with model.no_sync():
            yield
        return
    if _is_fsdp(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield
