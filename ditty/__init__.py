"""ditty: train and finetune PyTorch and Hugging Face models from declarative TOML recipes.

Heavy names (torch, transformers) load on first use, so `ditty check` and `ditty ls` stay fast.
The names below include the original Ditty library's public API (docs/python-api/coming-from-ditty.md).
The package root holds no other module: see docs/ARCHITECTURE.md for the packages and their layers.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
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
    # The Python API (ditty.compat.pipeline) and its building blocks, as the docs' examples import them.
    "Pipeline": "ditty.compat.pipeline",
    "Data": "ditty.compat.pipeline",
    "ModelFactory": "ditty.compat.model_factory",
    "FSDPConfig": "ditty.compat.model_factory",
    "QuantConfig": "ditty.compat.model_factory",
    "PeftConfig": "ditty.compat.model_factory",
    "TokenizerFactory": "ditty.compat.model_factory",
    "ModelTransform": "ditty.compat.model_factory",
    "RuntimeComponents": "ditty.train.components",
    # Post-training objectives from Python: Pipeline(preference=...), Pipeline(rl=..., reward_fn=...),
    # Pipeline(distill=...).
    "DistillConfig": "ditty.config.distill",
    "PreferenceConfig": "ditty.config.preference",
    "PreferenceLoss": "ditty.objectives.preference_loss",
    "RLConfig": "ditty.config.rl",
    "RolloutConfig": "ditty.config.rollout",
    "PreProcessor": "ditty.stages.processors",
    "PostProcessor": "ditty.stages.processors",
    "Context": "ditty.stages.processors",
    "LossCalculator": "ditty.stages.loss",
    "LossOutput": "ditty.stages.loss",
    "MSELoss": "ditty.stages.loss",
    "L1Loss": "ditty.stages.loss",
    "CrossEntropyLoss": "ditty.stages.loss",
    "CompositeLoss": "ditty.stages.loss",
    "UncertaintyWeightedLoss": "ditty.stages.loss",
    # Contracts (ditty.contracts).
    "Contract": "ditty.contracts",
    "TensorSpec": "ditty.contracts",
    "ContractViolation": "ditty.contracts",
    "ContractParseError": "ditty.contracts",
    "parse_contract": "ditty.contracts",
    "validate_pipeline_chain": "ditty.contracts",
    "format_pipeline_contracts": "ditty.contracts",
    # The rest of the original Ditty's names.
    "print_pipeline": "ditty.compat.porting",
    "TrainerState": "ditty.compat.porting",
    "CheckpointManager": "ditty.compat.porting",
    "Checkpoint": "ditty.compat.porting",
    "MetricsLogger": "ditty.compat.metrics_logger",
    "Environment": "ditty.compat.environments",
    "EnvironmentStepResult": "ditty.compat.environments",
    "FusedLinearCrossEntropyLoss": "ditty.stages.fused_loss",
}
_REFUSED = {
    "DittyBase": "subclass ditty.PreProcessor, ditty.PostProcessor or ditty.LossCalculator (each has name and "
    "contract)",
    "optimizers": "pass your own optimizer instance: Pipeline(optimizer=...)",
}
"""Names of the original Ditty that ditty does not have, and what to use instead."""

# --------------------------------------------------------------------------------- moved modules

MOVED_MODULES = {
    "ditty.pipeline": "ditty.compat.pipeline",
    "ditty.pipeline_options": "ditty.compat.pipeline_options",
    "ditty.model_factory": "ditty.compat.model_factory",
    "ditty.model_configs": "ditty.compat.model_configs",
    "ditty.porting": "ditty.compat.porting",
    "ditty.metrics_logger": "ditty.compat.metrics_logger",
    "ditty.environments": "ditty.compat.environments",
    "ditty.loss": "ditty.stages.loss",
    "ditty.processors": "ditty.stages.processors",
    "ditty.task_losses": "ditty.stages.task_losses",
    "ditty.fused_loss": "ditty.stages.fused_loss",
    "ditty.diffusion": "ditty.stages.diffusion",
    "ditty.evaluation": "ditty.metrics.harness",
    "ditty.cli_plan": "ditty.cli.memory_plan",
    "ditty.data.digits": "ditty.data.formats.images",
    "ditty.train.runtime": "ditty.parallel.runtime",
    "ditty.train.export": "ditty.cli.export",
    "ditty.train.speed": "ditty.parallel.speed",
    "ditty.train.precision": "ditty.parallel.precision",
    "ditty.train.loss_parameters": "ditty.stages.loss_parameters",
    "ditty.train.preference_loss": "ditty.objectives.preference_loss",
    "ditty.train.preference": "ditty.objectives.reference",
    "ditty.objectives.preference": "ditty.objectives.dpo_family",
    "ditty.objectives.distill": "ditty.objectives.gkd",
    "ditty.data.formats.preference": "ditty.data.formats.preference_rows",
    "ditty.recipe.compat": "ditty.recipe.compatibility_rules",
    "ditty.recipe.plan": "ditty.recipe.compiled",
    "ditty.cli.plan": "ditty.cli.memory_plan",
    "ditty.objectives.rl.samplers": "ditty.objectives.sampling.sampler",
    "ditty.objectives.rl.sampling": "ditty.objectives.sampling.generate_sampler",
    "ditty.objectives.rl.vllm_sampler": "ditty.objectives.sampling.vllm_sampler",
    "ditty.objectives.rl.vllm_server": "ditty.objectives.sampling.vllm_server",
    "ditty.objectives.policy_sampling": "ditty.objectives.sampling.policy_sampling",
    "ditty.objectives.rl.ahead": "ditty.objectives.sampling.ahead",
    "ditty.objectives.rl.policy_weights": "ditty.objectives.sampling.policy_weights",
    "ditty.objectives.rl.correction": "ditty.objectives.sampling.correction",
    "ditty.objectives.rl.batch": "ditty.objectives.sampling.batch",
    "ditty.objectives.rollout_rules": "ditty.objectives.sampling.rollout_rules",
    "ditty.objectives.stream_state": "ditty.objectives.sampling.stream_state",
    "ditty.objectives.rl.environment": "ditty.objectives.environments.protocol",
    "ditty.objectives.rl.episodes": "ditty.objectives.environments.episodes",
    "ditty.objectives.rl.rendering": "ditty.objectives.environments.rendering",
    "ditty.objectives.rl.openenv": "ditty.objectives.environments.openenv",
    "ditty.objectives.rl.episode_evaluation": "ditty.objectives.environments.episode_evaluation",
    "ditty.objectives.rl.tools": "ditty.objectives.environments.tools.tool_environment",
    "ditty.objectives.rl.tool_calls": "ditty.objectives.environments.tools.calls",
    "ditty.objectives.rl.builtin_tools": "ditty.objectives.environments.tools.builtin_tools",
    "ditty.objectives.rl.tool_process": "ditty.objectives.environments.tools.process",
    "ditty.objectives.rl.tool_worker": "ditty.objectives.environments.tools.worker",
    "ditty.objectives.grpo": "ditty.objectives.rl.grpo",
    "ditty.objectives.rloo": "ditty.objectives.rl.rloo",
    "ditty.objectives.rl.advantages": "ditty.objectives.rl.turn_credit",
    "ditty.objectives.builtin_rewards": "ditty.objectives.rewards.builtin_rewards",
    "ditty.objectives.reward_scorer": "ditty.objectives.rewards.scorer",
}
"""Module names users import (the original Ditty's, and ditty's own before its root was tidied)
-> where the module lives now. `import ditty.loss` gives the module `ditty.stages.loss` itself (one
object, so isinstance checks, monkeypatching and "ditty.loss:MSELoss" references all agree); a
submodule of a moved package follows it (`ditty.fused_loss.kernels`). Nothing is imported until
an old name is: `import ditty` stays cheap. New code imports the new names."""


def moved_to(name: str) -> str | None:
    """The module's name now, for an old name in MOVED_MODULES (or a submodule of one); else None."""
    for old, new in MOVED_MODULES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta-path finder that answers an old module name with the module under its new name."""

    def __init__(self) -> None:
        self._specs: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if moved_to(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        module = importlib.import_module(moved_to(spec.name))
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        # The import system stamped the alias spec on the module it got from create_module; give
        # the module its own back (relative imports and importlib.reload read it).
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    # First: a moved package's old name must not reach the path finder, which would load a
    # second copy of its submodules under the old name.
    sys.meta_path.insert(0, _MovedModules())


def __getattr__(name: str) -> Any:
    if f"ditty.{name}" in MOVED_MODULES:  # `import ditty; ditty.diffusion.Scheduler`, as the original allowed
        return importlib.import_module(f"ditty.{name}")
    if name in _REFUSED:
        from ditty.config.errors import RecipeError

        raise RecipeError.single(f"ditty has no {name} (a name of the original Ditty)", key=name, fix=_REFUSED[name])
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ditty' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted([*_LAZY, "diffusion"])
