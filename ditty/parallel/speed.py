"""Activation checkpointing and torch.compile, applied to the built model (`apply_speedups`).

The Trainer calls `apply_speedups` once, after the converters (LoRA, float8) and before
parallelization (`build_parallel`) and the optimizer, in torchtitan's order: FSDP2 then wraps the
checkpointed/compiled blocks. Both rewrites work per transformer block (the modules
`ditty.parallel.wrap.find_blocks` returns: `parallel.block_classes`, else the model's
`_no_split_modules`, else, for a custom model that declares neither, its children), keep every
Parameter object, and leave the state-dict keys unchanged, so the optimizer, checkpoints and the
final Hugging Face save see the same model.

Activation checkpointing (`train.activation_checkpointing`):
- "full": every block is wrapped in torch's `CheckpointWrapper` (non-reentrant, so it works with
  kwargs, with frozen base weights under PEFT and with torch.compile); the block's activations are
  dropped after the forward and recomputed in the backward. Cost: about one extra forward per step.
- "selective": op-level selective checkpointing (SAC) per block: the outputs of the matrix
  products and attention (the expensive ops) are kept, everything else (norms, activations, rotary
  embeddings, residual adds: cheap, memory-heavy element-wise ops) is recomputed. Costs a few
  percent of compute, saves the element-wise activations.
  The wrapper's state-dict hooks strip its `_checkpoint_wrapped_module.` prefix, so saved keys
  do not change; parameter names (`named_parameters`) do carry the prefix.

Compile (`train.compile`, `train.compile_scope`):
- "blocks" (default): `module.compile()` on each (checkpoint-wrapped) block: in place, so no
  `OptimizedModule` wrapper appears, the model's class, state dict and `generate` are untouched, and
  one compiled graph serves every block of the same shape (speed-ups in BENCHMARKS.md).
- "model": `model.compile()` on the whole model (also in place): one graph, no gain on CPU, ~37 s.
Compilation happens lazily on the first forward, so the first step carries the compile time;
`ditty.parallel.compile_report` then says how many graphs it made, and warns when it fell back.

Compile over activation checkpointing allows a block's forward Python side effects
(`_compiled_with_side_effects`): transformers 5.25 and newer route attention through the `kernels`
package, whose `use_kernelized_func` wrapper sets and resets a module-level variable around every
attention forward while compiling. Dynamo refuses any side effect inside a checkpointed region (eager
checkpointing would replay it in the backward's recomputation, compiled code cannot), breaks the graph
and runs the whole block eagerly: no graph at all, without an error. That set-and-reset leaves nothing
the recomputation needs, so not replaying it is safe; the setting is scoped to the compiled blocks'
calls, not set for the process.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn

AC_MODES = ("none", "full", "selective")
COMPILE_SCOPES = ("blocks", "model")

# Ops whose outputs selective checkpointing keeps (recomputing them would cost a matmul each).
_SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def apply_speedups(model: nn.Module, config: Any) -> nn.Module:
    """`train.activation_checkpointing`, then `train.compile`; returns the (same) model."""
    t = config.train
    names = list(config.parallel.block_classes) or None
    if t.activation_checkpointing != "none":
        model = apply_activation_checkpointing(model, t.activation_checkpointing, block_names=names)
    if t.compile:
        mode = t.compile_mode
        model = apply_compile(
            model, t.compile_scope, block_names=names, **({} if mode == "default" else {"mode": mode})
        )
    return model


def apply_activation_checkpointing(
    model: nn.Module, mode: str, block_classes: Optional[Sequence[type]] = None, block_names: Optional[list[str]] = None
) -> nn.Module:
    """Wrap each block in a non-reentrant `CheckpointWrapper` ("full") or an op-level selective
    one ("selective"); "none" returns the model untouched."""
    if mode not in AC_MODES:
        raise ValueError(f"activation_checkpointing must be one of {AC_MODES}, not {mode!r}")
    if mode == "none":
        return model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    kwargs: dict[str, Any] = {"checkpoint_impl": CheckpointImpl.NO_REENTRANT, "preserve_rng_state": True}
    if mode == "selective":
        kwargs["context_fn"] = _selective_context
    blocks = {id(b) for b in _blocks(model, block_classes, block_names)}
    _replace_children(model, lambda m: id(m) in blocks, lambda m: checkpoint_wrapper(m, **kwargs))
    return model


def apply_compile(
    model: nn.Module,
    scope: str = "blocks",
    block_classes: Optional[Sequence[type]] = None,
    block_names: Optional[list[str]] = None,
    **compile_kwargs: Any,
) -> nn.Module:
    """Compile each block in place ("blocks"; a checkpoint-wrapped block is compiled with its
    wrapper) or the whole model ("model"). Returns the same module object."""
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"compile_scope must be one of {COMPILE_SCOPES}, not {scope!r}")
    targets = [model] if scope == "model" else outer_blocks(model, block_classes, block_names)
    for module in targets:
        module.compile(**compile_kwargs)
        module._compiled_call_impl = _compiled_with_side_effects(module._compiled_call_impl)
    return model


def _compiled_with_side_effects(compiled_call):
    """The compiled call, traced with dynamo's `skip_fwd_side_effects_in_bwd_under_checkpoint` (the
    module's docstring says why). Tracing happens inside the call, so the setting holds exactly there.
    Cost: one config patch (a few attribute sets) per block call."""
    import torch._dynamo

    return torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True)(compiled_call)


def outer_blocks(
    model: nn.Module, block_classes: Optional[Sequence[type]] = None, block_names: Optional[list[str]] = None
) -> list[nn.Module]:
    """The blocks, each replaced by its checkpoint wrapper when it has one."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

    blocks = {id(b) for b in _blocks(model, block_classes, block_names)}
    out = []
    for module in model.modules():
        if isinstance(module, ActivationWrapper) and id(module._checkpoint_wrapped_module) in blocks:
            out.append(module)
            blocks.discard(id(module._checkpoint_wrapped_module))
        elif id(module) in blocks:
            out.append(module)
    return out


def compiled_modules(model: nn.Module) -> list[nn.Module]:
    """Modules compiled in place (`_compiled_call_impl` set) or wrapped by torch.compile (for tests)."""
    from torch._dynamo.eval_frame import OptimizedModule

    return [
        m
        for m in model.modules()
        if getattr(m, "_compiled_call_impl", None) is not None or isinstance(m, OptimizedModule)
    ]


def checkpointed_modules(model: nn.Module) -> list[nn.Module]:
    """The checkpoint wrappers in a model (for tests)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

    return [m for m in model.modules() if isinstance(m, ActivationWrapper)]


# ---------------------------------------------------------------------------------------- helpers


def _blocks(model: nn.Module, classes: Optional[Sequence[type]], names: Optional[list[str]]) -> list[nn.Module]:
    from ditty._utils.modules import LOSS_MODULE
    from ditty.parallel.wrap import find_blocks

    # A model that declares no blocks (a custom nn.Module without _no_split_modules or
    # parallel.block_classes) is checkpointed / compiled child by child.
    return find_blocks(
        model, names=names, classes=list(classes) if classes else None, or_children=True, skip=(LOSS_MODULE,)
    )


def _replace_children(module: nn.Module, match, make) -> None:
    """Replace every matching descendant (outermost first; a replaced module is not descended into)."""
    for name, child in list(module.named_children()):
        if match(child):
            setattr(module, name, make(child))
        else:
            _replace_children(child, match, make)


def _save_matmuls(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_save_matmuls)
