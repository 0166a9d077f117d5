"""The model's output head, taken apart for the fused cross-entropy: its input (`emit_head_input`
hands it through instead of projecting it) and its projection (`head_projection`: weight, bias,
logit scale and softcap), for nn.Linear, PEFT's LoRA and ModulesToSave wrappers, FSDP2's units and
sharded DTensors, tied or untied.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional

from ditty._utils.modules import unwrap

if TYPE_CHECKING:
    from torch import Tensor, nn


@dataclass
class Projection:
    """logits = transform(hidden @ weight.T + bias), the model's output head in parts."""

    weight: "Tensor"
    bias: "Optional[Tensor]" = None
    scale: float = 1.0
    """Multiplies the logits (cohere's logit_scale, granite's 1 / logits_scaling)."""
    softcap: Optional[float] = None
    """cap * tanh(logits / cap) (gemma2/gemma3's final_logit_softcapping)."""


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


def head_projection(head: "nn.Module", config: Any = None, *, keep_vocab_shards: bool = False) -> Projection:
    """Weight, bias and logit transform of an output head: nn.Linear (also FSDP2's unsharded one), a
    PEFT LoRA layer (base weight plus the merged low-rank update, so the adapter gets gradients), or
    PEFT's ModulesToSaveWrapper (the trained copy). A DTensor weight is gathered differentiably, unless
    `keep_vocab_shards` and it is a tensor-parallel head's vocabulary shard (ditty.stages.vocab_parallel)."""
    weight, bias = _linear_parts(head)
    scale, softcap = 1.0, None
    if config is not None:
        if getattr(config, "logit_scale", None) is not None:  # cohere, cohere2
            scale = float(config.logit_scale)
        if getattr(config, "logits_scaling", None) is not None:  # granite, granitemoe
            scale = 1.0 / float(config.logits_scaling)
        softcap = getattr(config, "final_logit_softcapping", None)  # gemma2, gemma3
    if keep_vocab_shards:
        from ditty.stages.vocab_parallel import tensor_parallel_rows

        if tensor_parallel_rows(weight):
            return Projection(weight, bias, scale, softcap)
    return Projection(replicated(weight), replicated(bias), scale, softcap)


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


def replicated(tensor: "Optional[Tensor]") -> "Optional[Tensor]":
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
