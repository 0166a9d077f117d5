"""Per-row sums over context-parallel pieces: under `parallel.cp` each rank holds a piece of every row
(ditty.data.context_shard), and a loss over whole rows (the DPO family: a completion's log-probability
is the sum over all its tokens) needs each row's sum on every rank of the group.

`whole_row_sums(values)` all-reduces the pieces' sums over the context-parallel group that the engine
has active for the micro-batch (ditty.models.ulysses.context_parallel); outside one (one process,
evaluation of whole rows) it returns them as they are. Every rank of the group then computes the same
loss from the same sums, and returns `1 / cp` of it (`piece_share`): the trainer adds the ranks'
losses and metrics over the batch group, which holds the context ranks too. Backward, the sum's
gradient on each rank is the `1 / cp` share of that rank's loss, so it is all-reduced (summed) on the
way back: each piece gets the whole loss's gradient for its own tokens, and FSDP's reduction over
the data- and context-parallel ranks adds the pieces' parameter gradients together.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor


class _SumOverPieces(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: Tensor, group: Any) -> Tensor:
        ctx.group = group
        total = values.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def context_group() -> Optional[Any]:
    """The active context-parallel group of more than one rank, else None."""
    from ditty.models.ulysses import context_parallel_group

    group = context_parallel_group()
    return group if group is not None and dist.get_world_size(group) > 1 else None


def whole_row_sums(values: Tensor) -> Tensor:
    """Each row's sum over the context-parallel pieces (see the module doc); `values` as they are
    outside context parallel."""
    group = context_group()
    if group is None:
        return values
    if not values.requires_grad:
        total = values.clone()
        dist.all_reduce(total, group=group)
        return total
    return _SumOverPieces.apply(values, group)


def piece_share() -> float:
    """The share of a whole-row loss this context-parallel rank returns: 1 / cp (1 outside)."""
    group = context_group()
    return 1.0 if group is None else 1.0 / dist.get_world_size(group)
