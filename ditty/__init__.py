"""ditty: train and finetune PyTorch and Hugging Face models from declarative TOML recipes.

Heavy names (torch, transformers) load on first use, so `ditty check` and `ditty ls` stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "TrainerConfig": "ditty.config",
    "RecipeError": "ditty.config",
    "Trainer": "ditty.train",
    # The Python API (ditty.pipeline) and its building blocks, as the README's examples import them.
    "Pipeline": "ditty.pipeline",
    "ModelFactory": "ditty.pipeline",
    "FSDPConfig": "ditty.pipeline",
    "Data": "ditty.pipeline",
    "RuntimeComponents": "ditty.train.components",
    "PreProcessor": "ditty.processors",
    "PostProcessor": "ditty.processors",
    "Context": "ditty.processors",
    "LossCalculator": "ditty.loss",
    "LossOutput": "ditty.loss",
    "MSELoss": "ditty.loss",
    "L1Loss": "ditty.loss",
    "CrossEntropyLoss": "ditty.loss",
    "CompositeLoss": "ditty.loss",
    "FusedLinearCrossEntropyLoss": "ditty.fused_loss",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ditty' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_LAZY)
