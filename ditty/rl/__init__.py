"""The parts of on-policy training a user writes, and what they are checked against, from one place.

    from ditty.rl import StepResult                     # an environment's answer to a model turn
    from ditty.rl import AdvantageEstimator, PolicyLoss  # `[rl] advantage` / `loss` = "package.module:fn"
    from ditty.rl import check_policy_loss              # the check every built-in part passes

The interfaces: `Environment` (reset/step; `[rl] environment`), `Sampler` (token ids in and out;
`[rollout] backend` picks a built-in one), `AdvantageEstimator`, `PolicyLoss`, `Assembler`; what they
pass: `StepResult`, `RolloutBatch`, `TurnRequest`, `TurnOutput`, `ObjectiveOutput` (a loss's share and
metrics) and `share`; the checks: `check_advantage_estimator`, `check_policy_loss`,
`check_environment`. examples/rl_parts.py writes an estimator and a loss through them. Names load on
first use: importing ditty.rl imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "StepResult": "ditty.objectives.environments.protocol",
    "Environment": "ditty.objectives.environments.protocol",
    "Observation": "ditty.objectives.environments.protocol",
    "Sampler": "ditty.objectives.sampling.sampler",
    "TurnOutput": "ditty.objectives.sampling.sampler",
    "TurnRequest": "ditty.objectives.sampling.generate_sampler",
    "RolloutBatch": "ditty.objectives.sampling.batch",
    "AdvantageEstimator": "ditty.objectives.rl.interfaces",
    "PolicyLoss": "ditty.objectives.rl.interfaces",
    "Assembler": "ditty.objectives.rl.interfaces",
    "ObjectiveOutput": "ditty.objectives.output",
    "share": "ditty.objectives.output",
    "check_advantage_estimator": "ditty.objectives.rl.contracts",
    "check_policy_loss": "ditty.objectives.rl.contracts",
    "check_environment": "ditty.objectives.rl.contracts",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'ditty.rl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
