"""Cross-entropy straight from the final hidden states and the output projection, in chunks of
tokens, so the `[tokens, vocab]` logits and their gradient never exist at once.

For a Llama-3 vocabulary (128,256) and 8,192 tokens the full fp32 logits are 4.2 GB, and the usual
path holds them, their log-softmax and their gradient. Here each chunk of tokens is projected,
its loss summed and, while the chunk's logits are still at hand, the gradients with respect to the
hidden states and the projection weight are accumulated (as Liger Kernel's fused linear
cross-entropy does): the backward only scales those by the incoming gradient. Peak extra memory is
one chunk of logits plus a weight-sized fp32 gradient buffer; the matrix products are the same
three a full-logits step runs (no recompute), so throughput does not drop.

Backends: "chunked" (this file, pure PyTorch, any device), "liger" (liger-kernel's Triton kernel)
and "cce" (Apple's cut-cross-entropy), the last two on CUDA only. Every backend returns the SUM of
the per-token losses and the token count, so the trainer's per-token normalisation over the global
batch is unchanged (ditty/loss.py).

How the hidden states get here: `emit_head_input(model)` switches the model's output projection
(`get_output_embeddings()`) to hand its input through instead of projecting it, for one forward;
`run_pipeline` puts that input in the context under HEAD_INPUT and the loss projects it. The
projection module is still called by the model's own forward, so the hooks of FSDP2 (which gathers
a sharded head there and keeps it gathered until backward), DDP and DeepSpeed run as usual.

torch is imported inside functions so the recipe compiler can import this module cheaply.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

from ditty.loss import IGNORE_INDEX, LossCalculator, LossOutput

if TYPE_CHECKING:
    from torch import Tensor, nn

BACKENDS = ("auto", "chunked", "liger", "cce")
GPU_BACKENDS = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}
"""Backend -> the package that provides it (Triton kernels: CUDA only)."""
HEAD_INPUT = "head_input"
"""Context key of the hidden states that went into the output projection."""


def backend_installed(backend: str) -> bool:
    return backend == "chunked" or importlib.util.find_spec(GPU_BACKENDS[backend]) is not None


def resolve_backend(backend: str, device_type: str) -> str:
    """ "auto" becomes liger, then cce, when installed and on CUDA, else chunked; a named GPU backend
    on another device is an error (the compiler reports it first for recipes)."""
    if backend not in BACKENDS:
        raise ValueError(f"loss backend must be one of {BACKENDS}, not {backend!r}")
    if backend == "auto":
        found = [b for b in GPU_BACKENDS if device_type == "cuda" and backend_installed(b)]
        return found[0] if found else "chunked"
    if backend in GPU_BACKENDS and (device_type != "cuda" or not backend_installed(backend)):
        raise RuntimeError(
            f'loss backend "{backend}" needs CUDA and the {GPU_BACKENDS[backend]} package '
            f'(device {device_type}, installed: {backend_installed(backend)}); use "chunked"'
        )
    return backend


# ---------------------------------------------------------------------------------- the projection


@dataclass
class Projection:
    """logits = transform(hidden @ weight.T + bias), the model's output head in parts."""

    weight: "Tensor"
    bias: "Optional[Tensor]" = None
    scale: float = 1.0
    """Multiplies the logits (cohere's logit_scale, granite's 1 / logits_scaling)."""
    softcap: Optional[float] = None
    """cap * tanh(logits / cap) (gemma2/gemma3's final_logit_softcapping)."""


def unwrap(model: "nn.Module") -> "nn.Module":
    """Through DDP (`.module`), torch.compile (`._orig_mod`) and DeepSpeed engines to the model."""
    import torch

    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def output_head(model: "nn.Module") -> "nn.Module":
    """The output projection module of a (PEFT-wrapped, DDP-wrapped) Hugging Face model."""
    base = unwrap(model)
    getter = getattr(base, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if head is None:
        raise TypeError(
            f"{type(base).__name__} has no output projection (get_output_embeddings() is None): the fused "
            "cross-entropy needs a causal LM head, or hidden_index/weight_index naming them in the output"
        )
    return head


def model_config(model: "nn.Module") -> Any:
    base = unwrap(model)
    get_base = getattr(base, "get_base_model", None)  # a PeftModel
    return getattr(get_base() if callable(get_base) else base, "config", None)


def head_projection(head: "nn.Module", config: Any = None) -> Projection:
    """Weight, bias and logit transform of an output head: nn.Linear (also FSDP2's unsharded one), a
    PEFT LoRA layer (base weight plus the merged low-rank update, so the adapter gets gradients), or
    PEFT's ModulesToSaveWrapper (the trained copy). A DTensor weight is gathered differentiably."""
    weight, bias = _linear_parts(head)
    scale, softcap = 1.0, None
    if config is not None:
        if getattr(config, "logit_scale", None) is not None:  # cohere, cohere2
            scale = float(config.logit_scale)
        if getattr(config, "logits_scaling", None) is not None:  # granite, granitemoe
            scale = 1.0 / float(config.logits_scaling)
        softcap = getattr(config, "final_logit_softcapping", None)  # gemma2, gemma3
    return Projection(_replicated(weight), _replicated(bias), scale, softcap)


def _linear_parts(head: "nn.Module") -> "tuple[Tensor, Optional[Tensor]]":
    import torch

    if hasattr(head, "modules_to_save") and hasattr(head, "original_module"):  # peft ModulesToSaveWrapper
        active = head.active_adapters
        inner = head.original_module if head.disable_adapters or not active else head.modules_to_save[active[0]]
        return _linear_parts(inner)
    if hasattr(head, "base_layer") and hasattr(head, "lora_A"):  # peft LoRA layer
        weight, bias = _linear_parts(head.base_layer)
        if head.disable_adapters or head.merged:
            return weight, bias
        for name in head.active_adapters:
            if name not in head.lora_A:
                continue
            if name in getattr(head, "lora_variant", {}):
                raise TypeError(f"{type(head).__name__}: a LoRA variant (DoRA) on the output head is not supported")
            dropout = head.lora_dropout[name]
            if not isinstance(dropout, torch.nn.Identity) and dropout.p > 0 and head.training:
                raise TypeError("LoRA dropout on the output head cannot be fused into one projection")
            weight = weight + head.get_delta_weight(name).to(weight.dtype)
        return weight, bias
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        raise TypeError(f"{type(head).__name__} is not a linear projection with a floating-point 2-D weight")
    return weight, getattr(head, "bias", None)


def _replicated(tensor: "Optional[Tensor]") -> "Optional[Tensor]":
    """A sharded DTensor gathered to a plain full tensor, differentiably (its gradient is sharded back)."""
    if tensor is None:
        return None
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(tensor, DTensor):
        return tensor.redistribute(placements=[Replicate()] * tensor.device_mesh.ndim).to_local()
    return tensor


class _HeadSwitch:
    """Stands in for the head's `forward` (an instance attribute): the original forward unless
    `active`, then the identity that records its input. One object per head, so torch.compile sees a
    stable attribute and the flag only."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.active = False
        self.hidden: "Optional[Tensor]" = None

    def __call__(self, hidden: "Tensor", *args: Any, **kwargs: Any) -> "Tensor":
        if not self.active:
            return self.original(hidden, *args, **kwargs)
        self.hidden = hidden
        return hidden


@contextmanager
def emit_head_input(model: "nn.Module") -> Iterator[_HeadSwitch]:
    """For the forwards inside: the output head returns (and records in `.hidden`) its input instead
    of the logits, so no [tokens, vocab] tensor is made. The model's own post-processing then runs on
    hidden states and its `logits` output is meaningless; the loss applies the head's transform
    (`head_projection`) itself."""
    head = output_head(model)
    switch = head.__dict__.get("forward")
    if not isinstance(switch, _HeadSwitch):
        switch = _HeadSwitch(head.forward)
        head.forward = switch
    switch.active, switch.hidden = True, None
    try:
        yield switch
    finally:
        switch.active = False


# ---------------------------------------------------------------------------------- the kernels


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

        total = linear_cross_entropy(
            hidden, weight, target, bias=bias, ignore_index=ignore_index, softcap=projection.softcap, reduction="sum"
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


# ---------------------------------------------------------------------------------- the calculator


class FusedLinearCrossEntropyLoss(LossCalculator):
    """Cross-entropy from hidden states and the output projection, never holding the full logits.

    Causal LM (the default, what `[train] loss_chunks` builds): the hidden states are the input of the
    model's output head (`emit_head_input`, set up by the trainer for this loss), the projection is
    the head itself (`get_output_embeddings()`: nn.Linear, LoRA-wrapped, FSDP2-sharded, tied or
    not), and `labels` are unshifted (Hugging Face convention: position t predicts label t + 1).

    Custom models (the original Ditty call): `hidden_index` names the hidden states in the model's
    output, `weight_index` / `bias_index` the projection weight and bias there, or
    `weight_attr_path` / `bias_attr_path` attributes of the model ("lm_head.weight"); targets are
    then `ctx[target_key]` aligned with the hidden states unless `shift`.

    Returns the per-token SUM and the token count, like CausalLMLoss, so the trainer normalises over
    the whole global batch. `backend`: "auto" (liger, else cce when installed and on CUDA, else
    chunked), "chunked", "liger" or "cce"; `chunks`: how many pieces the tokens of a micro-batch
    are cut into by the chunked backend (more pieces, less memory, smaller matrix products).
    """

    def __init__(
        self,
        hidden_index: Union[int, str, None] = None,
        weight_index: Union[int, str, None] = None,
        bias_index: Union[int, str, None] = None,
        backend: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        weight_attr_path: Optional[str] = None,
        bias_attr_path: Optional[str] = None,
        *,
        chunks: int = 8,
        target_key: str = "labels",
        mask_key: Optional[str] = None,
        shift: Optional[bool] = None,
        contract: Optional[str] = None,
    ) -> None:
        super().__init__(hidden_index if hidden_index is not None else 0, target_key, mask_key, contract=contract)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        if chunks < 1:
            raise ValueError(f"chunks must be at least 1, got {chunks}")
        self.hidden_index = hidden_index
        self.weight_index = weight_index
        self.bias_index = bias_index
        self.backend = backend
        self.ignore_index = ignore_index
        self.weight_attr_path = weight_attr_path
        self.bias_attr_path = bias_attr_path
        self.chunks = chunks
        self.shift = target_key == "labels" if shift is None else shift

    @property
    def uses_head_input(self) -> bool:
        """True when the hidden states come from the model's output head (see emit_head_input)."""
        return self.hidden_index is None

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        hidden = self.hidden_states(model_output, ctx)
        projection = self.projection(model_output, ctx)
        target = self.get_target(ctx)
        mask = self.get_mask(ctx)
        if mask is not None:
            target = target.masked_fill(~mask.bool().to(target.device), self.ignore_index)
        if self.shift:
            target = shifted(target, self.ignore_index)
        backend = resolve_backend(self.backend, hidden.device.type)
        total, count = fused_linear_cross_entropy(
            hidden, projection, target, ignore_index=self.ignore_index, chunks=self.chunks, backend=backend
        )
        return LossOutput(loss=total, num_tokens=count)

    def count_tokens(self, batch: Mapping) -> "Tensor":
        """Supervised tokens of a batch before its forward (the trainer's global-batch denominator)."""
        target = batch[self.target_key]
        if self.mask_key and self.mask_key in batch:
            target = target.masked_fill(~batch[self.mask_key].bool(), self.ignore_index)
        return ((target[..., 1:] if self.shift else target) != self.ignore_index).sum()

    def hidden_states(self, model_output: Any, ctx: Mapping) -> "Tensor":
        if self.hidden_index is None:
            hidden = ctx.get(HEAD_INPUT)
            if hidden is None:
                raise KeyError(
                    f"{type(self).__name__}: no {HEAD_INPUT!r} in the context; the model must run under "
                    "ditty.fused_loss.emit_head_input (the trainer does this), or set hidden_index"
                )
            return hidden
        return self.get_prediction(model_output)

    def projection(self, model_output: Any, ctx: Mapping) -> Projection:
        model = ctx.get("model")
        if self.weight_index is not None or self.weight_attr_path is not None:
            weight = self._pick(model_output, model, self.weight_index, self.weight_attr_path)
            bias = None
            if self.bias_index is not None or self.bias_attr_path is not None:
                bias = self._pick(model_output, model, self.bias_index, self.bias_attr_path, optional=True)
            return Projection(_replicated(weight), _replicated(bias))
        if model is None:
            raise KeyError(f"{type(self).__name__}: no 'model' in the context to take the output head from")
        return head_projection(output_head(model), model_config(model))

    def _pick(self, output: Any, model: Any, index: Any, path: Optional[str], optional: bool = False) -> Any:
        if index is not None:
            saved, self.output_index = self.output_index, index
            try:
                return self.get_prediction(output)
            except IndexError:
                if optional:
                    return None
                raise
            finally:
                self.output_index = saved
        obj = unwrap(model)
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj


def shifted(labels: "Tensor", ignore_index: int = IGNORE_INDEX) -> "Tensor":
    """Labels moved one position left (position t is scored on label t + 1), the last one ignored:
    aligned with every hidden state, so the hidden states need no slicing copy."""
    import torch

    pad = torch.full_like(labels[..., :1], ignore_index)
    return torch.cat([labels[..., 1:], pad], dim=-1)


def wants_head_input(loss: Any) -> bool:
    """Whether a loss (or a part of a composite loss) reads the output head's input."""
    if getattr(loss, "uses_head_input", False):
        return True
    return any(wants_head_input(part) for part, _ in getattr(loss, "parts", ()))
