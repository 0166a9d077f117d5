"""The autograd function behind ditty.stages.vocab_parallel_logps: per-token log-probabilities and
entropy from one rank's share of the vocabulary, with the group's all-reduces (see that module's doc
for the math), chunk by chunk so that no more than one chunk of one shard's logits exists at a time.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor


def _all_reduce(tensor: Tensor, op: "dist.ReduceOp", group: "Optional[dist.ProcessGroup]") -> Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


class ShardedLogProbs(torch.autograd.Function):
    """(log p(target), entropy) per row, from `inputs` [n, H] and `weight` [local, H] (this rank's rows,
    `bias` [local]) or, with `weight` None, from this rank's logits `inputs` [n, local]. `targets` [n]
    are global ids, `start` the global id of this rank's first row; entropies are 0 unless
    `want_entropy`. The forward keeps one log-sum-exp per row (and E[z] for entropy); the backward
    recomputes each chunk's logits."""

    @staticmethod
    def forward(ctx, inputs, weight, bias, targets, group, start, chunk_size, softcap, want_entropy):
        ctx.set_materialize_grads(False)
        n = inputs.shape[0]
        dtype = accumulation_dtype(inputs)
        logps = torch.empty(n, dtype=dtype, device=inputs.device)
        lse = torch.empty_like(logps)
        entropies = torch.zeros_like(logps)
        mean_logit = torch.zeros_like(logps) if want_entropy else torch.empty(0, dtype=dtype)
        with torch.no_grad():
            for first in range(0, n, chunk_size):
                last = min(first + chunk_size, n)
                logits, _ = chunk_logits(inputs[first:last], weight, bias, softcap, dtype)
                local = logits.shape[1]
                if local:
                    peak = logits.max(dim=1).values
                else:  # a rank with no rows of the vocabulary takes part in the reductions all the same
                    peak = torch.full((last - first,), -math.inf, dtype=dtype, device=logits.device)
                _all_reduce(peak, dist.ReduceOp.MAX, group)
                centred = logits - peak[:, None]
                exps = centred.exp()
                target = targets[first:last] - start
                here = (target >= 0) & (target < local)
                own = torch.zeros_like(peak)  # z_y - m from the rank that holds y, 0 elsewhere
                if local:
                    own = torch.where(here, centred.gather(1, target.clamp(0, local - 1)[:, None]).squeeze(1), own)
                parts = [exps.sum(dim=1), own]
                if want_entropy:
                    parts.append((exps * centred).sum(dim=1))
                sums = _all_reduce(torch.stack(parts, dim=1), dist.ReduceOp.SUM, group)
                log_total = sums[:, 0].log()
                logps[first:last] = sums[:, 1] - log_total
                lse[first:last] = peak + log_total
                if want_entropy:
                    spread = sums[:, 2] / sums[:, 0]  # E[z] - m
                    entropies[first:last] = log_total - spread
                    mean_logit[first:last] = peak + spread
        empty = torch.empty(0)
        ctx.save_for_backward(
            inputs,
            weight if weight is not None else empty,
            bias if bias is not None else empty,
            targets,
            lse,
            mean_logit,
        )
        ctx.has_weight, ctx.has_bias = weight is not None, bias is not None
        ctx.group, ctx.start, ctx.chunk_size, ctx.softcap = group, start, chunk_size, softcap
        ctx.want_entropy = want_entropy
        return logps, entropies

    @staticmethod
    def backward(ctx, grad_logps, grad_entropies):
        inputs, weight, bias, targets, lse, mean_logit = ctx.saved_tensors
        weight = weight if ctx.has_weight else None
        bias = bias if ctx.has_bias else None
        need_inputs, need_weight, need_bias = ctx.needs_input_grad[:3]
        dtype = lse.dtype
        grad_inputs = torch.empty(inputs.shape, dtype=dtype, device=inputs.device) if need_inputs else None
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=dtype, device=bias.device) if need_bias else None
        if not ctx.want_entropy:
            grad_entropies = None  # the entropies were not computed: constant zeros
        for first in range(0, inputs.shape[0], ctx.chunk_size):
            last = min(first + ctx.chunk_size, inputs.shape[0])
            chunk = inputs[first:last]
            logits, capped = chunk_logits(chunk, weight, bias, ctx.softcap, dtype)
            probs = (logits - lse[first:last, None]).exp()  # this rank's share of the softmax
            grad = torch.zeros_like(probs)
            if grad_logps is not None:  # d log p(y) / dz = onehot(y) - softmax
                g = grad_logps[first:last].to(dtype)
                grad -= probs * g[:, None]
                target = targets[first:last] - ctx.start
                here = ((target >= 0) & (target < logits.shape[1])).nonzero().squeeze(1)
                if here.numel():
                    grad[here, target[here]] += g[here]
            if grad_entropies is not None:  # d entropy / dz = -softmax (z - E[z])
                g = grad_entropies[first:last].to(dtype)
                grad -= probs * (logits - mean_logit[first:last, None]) * g[:, None]
            if capped is not None:
                grad *= 1.0 - capped.square()
            if weight is None:
                if grad_inputs is not None:
                    grad_inputs[first:last] = grad
                continue
            grad = grad.to(chunk.dtype)
            if grad_inputs is not None:
                grad_inputs[first:last] = grad @ weight
            if grad_weight is not None:
                grad_weight += grad.t() @ chunk
            if grad_bias is not None:
                grad_bias += grad.sum(0)
        if grad_inputs is not None and weight is not None:
            # Every rank holds the same hidden states; each rank's vocabulary rows add their share.
            _all_reduce(grad_inputs, dist.ReduceOp.SUM, ctx.group)
        return (
            grad_inputs.to(inputs.dtype) if grad_inputs is not None else None,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def chunk_logits(inputs: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], softcap, dtype):
    """(this rank's logits of one chunk after the softcap, in `dtype`; tanh(logits / cap) or None)."""
    logits = inputs if weight is None else torch.nn.functional.linear(inputs, weight, bias)
    logits = logits.to(dtype)
    if not softcap:
        return logits, None
    capped = torch.tanh(logits / softcap)
    return capped * softcap, capped


def accumulation_dtype(tensor: Tensor) -> torch.dtype:
    """fp32 for fp32/bf16/fp16 inputs (as ditty.objectives.logprobs), fp64 for fp64 ones (exact checks)."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32
