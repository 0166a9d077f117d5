"""A user's own optimizer instance (the Python API's `optimizer=`), checked against the model.

The optimizer must hold every trainable parameter of the model, as the same objects, and nothing
else (frozen parameters of the model may be there: they get no gradient, so no update). One built
over `model.parameters()` before the run is fine on one process and under DDP (which keeps the
Parameter objects). It cannot know parameters made later: LoRA adapters a converter adds, a loss's
parameters attached to the model, or FSDP's sharded ones. Every such mismatch would train less
than the user thinks and is refused here with the count and some names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ditty.config.errors import RecipeError

if TYPE_CHECKING:
    import torch


def check_given_optimizer(optimizer: "torch.optim.Optimizer", model: "torch.nn.Module") -> "torch.optim.Optimizer":
    """Return `optimizer` when its parameters are the model's trainable ones; else a RecipeError."""
    if not hasattr(optimizer, "param_groups") or not callable(getattr(optimizer, "step", None)):
        raise RecipeError.single(
            f"optimizer is a {type(optimizer).__name__}, not a torch.optim.Optimizer", key="optimizer"
        )
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    missing = [name for name, p in trainable if id(p) not in held]
    known = {id(p) for p in model.parameters()}  # frozen ones too: they get no gradient, so no update
    foreign = sum(1 for pid in held if pid not in known)
    fix = (
        "build the optimizer over the parameters the run trains, or leave optimizer= out and let ditty build it "
        "(lr=, weight_decay=, use_8bit_optim=)"
    )
    if missing:
        raise RecipeError.single(
            f"the optimizer does not hold {len(missing)} of the model's {len(trainable)} trainable parameters "
            f"(e.g. {', '.join(missing[:3])}); they would never be updated. Parameters made after the optimizer "
            "(LoRA adapters, a loss's parameters, FSDP shards) cannot be in it",
            key="optimizer",
            fix=fix,
        )
    if foreign:
        raise RecipeError.single(
            f"the optimizer holds {foreign} parameter(s) that are not the model's (built over another instance?)",
            key="optimizer",
            fix=fix,
        )
    return optimizer
