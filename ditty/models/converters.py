"""Model rewrites (LoRA/DoRA adapters, float8 linears, ...) behind one small protocol.

A converter takes the model the recipe defined and returns the model to train. The trainer
applies the recipe's converters in order, once, in this place of the build:

    build_model (weights loaded, or the architecture on the meta device)
      -> apply_converters(model, converters)      <- here
      -> parallelize (DDP / FSDP2), compile
      -> build_optimizer (sees only what the converters left trainable)
      -> loop: ... optimizer.step(); run_post_optimizer_hooks(model, converters)

When a rewrite can run is the converter's own business, documented on it:
- float8 swaps `nn.Linear` for `Float8Linear` without touching weight values, so it runs
  on the meta device, before weights are materialized, and FSDP then shards the converted model;
- LoRA/DoRA (`ditty.models.adapters.LoraConverter`) runs after the weights are loaded: peft wraps
  existing (possibly bitsandbytes-quantized) layers and needs their real shapes and dtypes, and a
  quantized base only exists once loaded.
Both must run before parallelization: FSDP2 and DDP capture the parameter set when they wrap.

`post_optimizer_hook(model)` is optional and runs after every optimizer step (float8 with FSDP2
computes the scales of all sharded weights there in one all-reduce instead of one per layer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class ModelConverter(Protocol):
    """A model rewrite. Implementations may also define `post_optimizer_hook(model) -> None`."""

    name: str
    """Short name for logs and errors, e.g. "lora", "float8"."""

    def convert(self, model: "torch.nn.Module") -> "torch.nn.Module":
        """Rewrite `model` (in place or not) and return the model to use from now on."""
        ...


def apply_converters(model: "torch.nn.Module", converters: Sequence[ModelConverter]) -> "torch.nn.Module":
    """Run each converter's `convert` in order, each on the previous one's result."""
    for converter in converters:
        model = converter.convert(model)
    return model


def post_optimizer_hooks(converters: Sequence[ModelConverter]) -> list:
    """The `post_optimizer_hook(model)` of every converter that has one, in order."""
    return [hook for hook in (getattr(c, "post_optimizer_hook", None) for c in converters) if hook is not None]


def run_post_optimizer_hooks(model: "torch.nn.Module", converters: Sequence[ModelConverter]) -> None:
    """Call `post_optimizer_hook(model)` of every converter that has one, in order."""
    for hook in post_optimizer_hooks(converters):
        hook(model)
