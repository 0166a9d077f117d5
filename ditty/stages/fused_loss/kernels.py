"""The fused linear cross-entropy kernels: "chunked" (pure PyTorch, here), "liger" and "cce".

Every backend returns the SUM of the per-token losses and the token count (ditty/stages/loss.py's token
losses), so the trainer's normalisation over the global batch is unchanged.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from typing import TYPE_CHECKING, Any

from ditty.stages.fused_loss.head import Projection
from ditty.stages.loss import IGNORE_INDEX

if TYPE_CHECKING:
    import torch
    from torch import Tensor

BACKENDS = ("auto", "chunked", "liger", "cce")
GPU_BACKENDS = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}
"""Backend -> the package that provides it (Triton kernels: CUDA only)."""


@functools.cache  # the loss resolves its backend on every call: look each package up once
def backend_installed(backend: str) -> bool:
    return backend == "chunked" or importlib.util.find_spec(GPU_BACKENDS[backend]) is not None


def half_dtype(hidden: "Tensor") -> "torch.dtype | None":
    """The half-precision dtype the head's matrix product runs in: the hidden states' own, or autocast's
    (whose matrix products cast fp32 inputs down); None in fp32 training."""
    import torch

    if hidden.dtype in (torch.bfloat16, torch.float16):
        return hidden.dtype
    if torch.is_autocast_enabled(hidden.device.type):
        return torch.get_autocast_dtype(hidden.device.type)
    return None


def resolve_backend(backend: str, device_type: str, *, half_precision: bool = True) -> str:
    """ "auto" becomes liger, then cce, when installed and on CUDA, else chunked; a named GPU backend
    on another device is an error (the compiler reports it first for recipes). cut-cross-entropy's
    backward takes bf16 or fp16 inputs only, so "auto" passes it over in fp32 training."""
    if backend not in BACKENDS:
        raise ValueError(f"loss backend must be one of {BACKENDS}, not {backend!r}")
    if backend == "auto":
        found = [
            b for b in GPU_BACKENDS if device_type == "cuda" and backend_installed(b) and (half_precision or b != "cce")
        ]
        return found[0] if found else "chunked"
    # A RecipeError (exit code 2, no traceback): the compiler refuses both cases where it can tell from
    # the recipe alone; these catch what only the loaded weights or the device show.
    from ditty.config.errors import RecipeError

    if backend == "cce" and not half_precision:
        raise RecipeError.single(
            'loss backend "cce" computes in bf16 or fp16 only, and this run\'s head computes in fp32',
            key="train.loss_backend",
            fix='use train.precision = "bf16", or train.loss_backend = "chunked" (or "auto")',
        )
    if backend in GPU_BACKENDS and (device_type != "cuda" or not backend_installed(backend)):
        raise RecipeError.single(
            f'loss backend "{backend}" needs CUDA and the {GPU_BACKENDS[backend]} package '
            f"(device {device_type}, installed: {backend_installed(backend)})",
            key="train.loss_backend",
            fix='use train.loss_backend = "chunked" (or "auto")',
        )
    return backend


def fused_linear_cross_entropy(
    hidden: "Tensor",
    projection: Projection,
    target: "Tensor",
    *,
    ignore_index: int = IGNORE_INDEX,
    chunks: int = 8,
    backend: str = "chunked",
) -> "tuple[Tensor, Tensor]":
    """(sum of cross-entropy over targets other than `ignore_index`, their count) for
    hidden [N, H] against target [N], logits = projection(hidden) computed per chunk.

    Tokens without a target are dropped before the projection (no matrix product is spent on prompt
    or padding positions); the cost is one host sync to count them. `chunks` splits the remaining
    tokens ("chunked" backend; liger and cce choose their own blocks).
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])
    target = target.reshape(-1).to(hidden.device)
    keep = target != ignore_index
    count = keep.sum()
    if int(count) < target.numel():
        rows = keep.nonzero().squeeze(1)
        hidden, target = hidden.index_select(0, rows), target.index_select(0, rows)
    if hidden.shape[0] == 0:  # nothing supervised: a zero that still reaches the parameters
        return hidden.sum() * 0.0 + projection.weight.sum() * 0.0, count
    weight, bias = projection.weight, projection.bias
    if projection.scale != 1.0:  # (s h) W^T = s (h W^T): the scale moves onto the input
        hidden = hidden * projection.scale
    if backend == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        total = liger_fused_linear_cross_entropy(
            hidden, weight, target, bias, ignore_index=ignore_index, reduction="sum", softcap=projection.softcap
        )
    elif backend == "cce":
        from cut_cross_entropy import linear_cross_entropy

        # Its backward asserts half-precision inputs: under autocast they are cast as the full-logits
        # head's matrix product would cast them (fp32 training is refused by resolve_backend).
        dtype = half_dtype(hidden) or hidden.dtype
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        # cut-cross-entropy's PyPI releases (25.1 and earlier) take no bias: pass one only where there is one.
        extra = {} if bias is None else {"bias": bias.to(dtype)}
        total = linear_cross_entropy(
            hidden, weight, target, ignore_index=ignore_index, softcap=projection.softcap, reduction="sum", **extra
        )
    elif backend == "chunked":
        chunk_size = max(1, math.ceil(hidden.shape[0] / max(1, chunks)))
        total = chunked_function().apply(hidden, weight, bias, target, chunk_size, projection.softcap)
    else:
        raise ValueError(f"unknown loss backend {backend!r}")
    return total.float(), count


@functools.cache
def chunked_function() -> Any:
    """The autograd Function of the "chunked" backend, defined on first use (the recipe compiler
    imports this module without torch).

    Sum of cross-entropy of softcap(hidden @ weight.T + bias) against target, chunk by chunk.
    Forward computes, per chunk, the fp32 logits, their log-sum-exp and the target logit, and, when
    gradients are wanted, d loss / d logits = softmax - onehot (times the softcap's derivative),
    turned at once into the chunk's hidden-state gradient and a running weight (and bias) gradient.
    Backward multiplies those by the scalar incoming gradient. Every target must be a valid class
    (the caller drops ignored positions).
    """
    import torch

    class ChunkedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, bias, target, chunk_size, softcap):
            grads = _chunked_forward(ctx.needs_input_grad[:3], hidden, weight, bias, target, chunk_size, softcap)
            total, stored = grads[0], grads[1:]
            ctx.present = tuple(g is not None for g in stored)
            ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
            ctx.save_for_backward(*(g if g is not None else torch.empty(0) for g in stored))
            return total

        @staticmethod
        def backward(ctx, grad_output):
            out = [
                (stored * grad_output).to(dtype) if present else None
                for present, stored, dtype in zip(ctx.present, ctx.saved_tensors, ctx.dtypes)
            ]
            return out[0], out[1], out[2], None, None, None

    return ChunkedLinearCrossEntropy


def _chunked_forward(needs_grad, hidden, weight, bias, target, chunk_size, softcap):
    """(loss sum, d/d hidden, d/d weight, d/d bias) with None for gradients nobody asked for."""
    import torch

    need_hidden, need_weight = needs_grad[0], needs_grad[1]
    need_bias = bias is not None and needs_grad[2]
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
    grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk_size):
        h = hidden[start : start + chunk_size]
        t = target[start : start + chunk_size]
        logits = torch.nn.functional.linear(h, weight, bias).float()
        capped = None
        if softcap:
            capped = torch.tanh(logits / softcap)
            logits = capped * softcap
        lse = torch.logsumexp(logits, dim=-1)
        total += (lse - logits.gather(1, t[:, None]).squeeze(1)).sum()
        if not (need_hidden or need_weight or need_bias):
            continue
        # d loss / d logits = softmax - onehot, made in place in the chunk's logits buffer
        grad = logits.sub_(lse[:, None]).exp_()
        grad[torch.arange(t.shape[0], device=t.device), t] -= 1.0
        if capped is not None:
            grad.mul_(1.0 - capped.square_())
        grad = grad.to(h.dtype)
        if grad_hidden is not None:
            grad_hidden[start : start + chunk_size] = grad @ weight
        if grad_weight is not None:
            grad_weight += grad.t() @ h
        if grad_bias is not None:
            grad_bias += grad.sum(0)
    return total, grad_hidden, grad_weight, grad_bias
