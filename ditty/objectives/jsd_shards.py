"""The pieces of the generalised JSD (ditty.objectives.jsd) on vocabulary shards (tensor parallel): each
rank holds its rows of the student's and the teacher's output heads, the same rows of both (the two
models are split alike), and computes its own columns of every token's logits; the group completes
each per-token quantity with one all-reduce, so no rank forms a token's whole vocabulary.

    log p_j = z_j - (m + log sum-over-ranks sum_j exp(z_j - m)),   m = max over ranks of max_j z_j
    KL(P || Q) per token = sum over ranks of sum_j p_j (log p_j - log q_j)
    log p(y) = the log-probability from the rank that holds y, 0 elsewhere, summed over ranks

The per-token sums are `sum_over_group` (forward all-reduce, backward the identity: every rank computes
the same loss from the sum, so each rank's part has the sum's gradient). The softmax's normaliser is
summed the same way forward, but each rank then uses it on its own columns only, so its gradient is a
partial sum too and is all-reduced on the way back; so is the student's hidden states' (`copy_to_group`:
forward the identity, backward the all-reduce of the partial gradients that each rank's columns give).
Without a group every function is its plain one.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.distributed as dist
from torch import Tensor


class VocabGroup(NamedTuple):
    """The ranks that split the vocabulary, and the global id of this rank's first row."""

    group: "dist.ProcessGroup"
    start: int


class _SumOverGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: Tensor, group: "dist.ProcessGroup") -> Tensor:
        total = tensor.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class _SumBothWays(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: Tensor, group: "dist.ProcessGroup") -> Tensor:
        ctx.group = group
        total = tensor.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: Tensor, group: "dist.ProcessGroup") -> Tensor:
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def sum_over_group(tensor: Tensor, shard: Optional[VocabGroup]) -> Tensor:
    """The sum of `tensor` over the group's ranks, differentiably (see the module doc)."""
    return tensor if shard is None else _SumOverGroup.apply(tensor, shard.group)


def sum_both_ways(tensor: Tensor, group: "dist.ProcessGroup") -> Tensor:
    """The sum of `tensor` over `group`, whose gradient is summed over the group too: for a sum that each
    rank then uses on its own part only (its columns, its piece of the rows), so each rank's gradient of
    it is a partial one (ditty.objectives.context_rows uses it for the rows' sums over context pieces)."""
    return _SumBothWays.apply(tensor, group)


def copy_to_group(tensor: Tensor, shard: Optional[VocabGroup]) -> Tensor:
    """`tensor` itself; its gradient summed over the group's ranks on the way back."""
    return tensor if shard is None else _CopyToGroup.apply(tensor, shard.group)


def max_over_group(values: Tensor, shard: Optional[VocabGroup]) -> Tensor:
    """The elementwise max over the group's ranks (no gradient)."""
    values = values.detach().clone()
    if shard is not None:
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=shard.group)
    return values


def log_softmax(logits: Tensor, shard: Optional[VocabGroup]) -> Tensor:
    """This rank's columns of log_softmax over the whole vocabulary, differentiably."""
    if shard is None:
        return torch.log_softmax(logits, dim=-1)
    peak = max_over_group(logits.amax(dim=-1), shard)
    # The normaliser's gradient on each rank comes from that rank's columns only: summed on the way back.
    total = sum_both_ways((logits - peak[:, None]).exp().sum(dim=-1), shard.group)
    return logits - (peak + total.log())[:, None]


def pick(values: Tensor, target: Tensor, shard: Optional[VocabGroup]) -> Tensor:
    """values[i, target[i]] [n] for global ids `target`, from the rank whose columns hold each."""
    if shard is None:
        return values.gather(-1, target[:, None]).squeeze(-1)
    local = target - shard.start
    here = (local >= 0) & (local < values.shape[-1])
    mine = values.gather(-1, local.clamp(0, values.shape[-1] - 1)[:, None]).squeeze(-1)
    return sum_over_group(torch.where(here, mine, mine.new_zeros(())), shard)
