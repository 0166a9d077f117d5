"""Reaching the user's module through the wrappers training puts around it."""

from __future__ import annotations

from typing import Any

LOSS_MODULE = "ditty_loss"
"""Name under which a loss's parameters join the model (ditty.stages.loss_parameters); the
per-block rewrites and sharding leave it out, since forward never calls it."""


def unwrap(model: Any, *, peft: bool = False) -> Any:
    """The user's module under torch.compile (`_orig_mod`) and DDP/DeepSpeed (`.module`) wrappers, and
    with `peft` under a peft model too (its base model). The one unwrap helper of ditty."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if inner is None and type(model).__name__ in ("DistributedDataParallel", "DataParallel", "DeepSpeedEngine"):
            inner = model.module
        if inner is None and peft and is_peft_model(model):
            inner = model.get_base_model()
        if inner is None or inner is model:
            return model
        model = inner


def is_peft_model(model: Any) -> bool:
    """A peft model (an adapter over a base model)."""
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")
