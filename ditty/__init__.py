"""ditty: train and finetune PyTorch and Hugging Face models from declarative TOML recipes.

Heavy names (torch, transformers) load on first use, so `ditty check` and `ditty ls` stay fast.
The names below include the original Ditty library's public API (README "Coming from Ditty").
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__version__ = "0.1.0"

# DITTY_CPU_ALLOCATOR=return (ditty.parallel.allocator) pays for returning freed memory with huge
# pages; torch reads THP_MEM_ALLOC_ENABLE once, at its first allocation, so it can only be set here,
# before anything imports torch.
if "torch" not in sys.modules:
    from ditty.parallel.allocator import HUGE_PAGES_ENV, huge_pages_at_import

    if huge_pages_at_import():
        os.environ.setdefault(HUGE_PAGES_ENV, "1")

_LAZY = {
    "TrainerConfig": "ditty.config",
    "RecipeError": "ditty.config",
    "Trainer": "ditty.train",
    # The Python API (ditty.pipeline) and its building blocks, as the README's examples import them.
    "Pipeline": "ditty.pipeline",
    "Data": "ditty.pipeline",
    "ModelFactory": "ditty.model_factory",
    "FSDPConfig": "ditty.model_factory",
    "QuantConfig": "ditty.model_factory",
    "PeftConfig": "ditty.model_factory",
    "TokenizerFactory": "ditty.model_factory",
    "ModelTransform": "ditty.model_factory",
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
    "UncertaintyWeightedLoss": "ditty.loss",
    # Contracts (ditty.contracts).
    "Contract": "ditty.contracts",
    "TensorSpec": "ditty.contracts",
    "ContractViolation": "ditty.contracts",
    "ContractParseError": "ditty.contracts",
    "parse_contract": "ditty.contracts",
    "validate_pipeline_chain": "ditty.contracts",
    "format_pipeline_contracts": "ditty.contracts",
    # The rest of the original Ditty's names.
    "print_pipeline": "ditty.porting",
    "TrainerState": "ditty.porting",
    "CheckpointManager": "ditty.porting",
    "Checkpoint": "ditty.porting",
    "MetricsLogger": "ditty.metrics_logger",
    "FusedLinearCrossEntropyLoss": "ditty.fused_loss",
}
_MODULES = {"diffusion": "ditty.diffusion"}
"""Submodules the original exposed as attributes of the package (`from ditty import diffusion`)."""
_REFUSED = {
    "DittyBase": "subclass ditty.PreProcessor, ditty.PostProcessor or ditty.LossCalculator (each has name and "
    "contract)",
    "optimizers": "pass your own optimizer instance: Pipeline(optimizer=...)",
}
"""Names of the original Ditty that ditty does not have, and what to use instead."""


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if name in _REFUSED:
        from ditty.config.errors import RecipeError

        raise RecipeError.single(f"ditty has no {name} (a name of the original Ditty)", key=name, fix=_REFUSED[name])
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ditty' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted([*_LAZY, *_MODULES])
