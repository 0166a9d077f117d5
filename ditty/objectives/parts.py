"""What an objective's row builds (ditty.objectives.table): the parts the trainer uses in its loop.

The trainer's `build_objective` step builds them once, in `__init__`'s order, from the typed run
(ditty.train.state.TrainRun: config, runtime, engine, tokenizer, data, model, precision, components);
nothing is replaced after it. A part left None is the trainer's own: the data mode's stream of
micro-batches and its evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional


def no_step_metrics() -> dict[str, float]:
    return {}


def nothing_to_do() -> None:
    return None


@dataclass
class ObjectiveParts:
    loss: Any
    """The pipeline's loss stage (a LossCalculator)."""
    stream: Optional[Any] = None
    """The step's micro-batches (`next_step()`, `cursor`, `state_dict()`, ...) when the objective makes
    its own, as RL does from rollouts; None: the data mode's stream."""
    evaluation: Optional[Any] = None
    """`evaluate(request) -> {val_*: value}` in place of the data mode's evaluation; None: the data mode's."""
    reference: Optional[Any] = None
    """The reference model the loss compares with (ditty.objectives.reference.Reference), or None."""
    step_metrics: Callable[[], dict[str, float]] = no_step_metrics
    """The values of the step just taken that belong to no micro-batch (a rollout's rewards, lengths,
    timings): logged beside the loss's own metrics."""
    after_update: Callable[[], None] = nothing_to_do
    """Called after each optimizer update that changed the weights (not after a step skipped as
    non-finite): an on-policy row counts the policy's versions with it (ditty.objectives.sampling.policy_sampling)."""
