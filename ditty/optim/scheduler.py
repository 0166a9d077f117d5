"""Learning-rate schedules: linear warmup, then constant, linear, cosine or warmup-stable-decay.

Every schedule is a closed-form factor of the step, run by torch's `LambdaLR`. Chaining torch's own
schedulers (SequentialLR over LinearLR and CosineAnnealingLR) was the alternative; it was not taken
because those update the learning rate recursively from the previous value (rounding drifts), their
milestone hand-over has had off-by-one bugs, and resuming depends on each child's state. A closed
form depends on the step alone, so a restored `last_epoch` gives exactly the same rate, and the
shape is easy to test at known steps.

Conventions (step s counts optimizer steps from 0; the rate at s is used by step s):
- warmup of W steps: factor (s + 1) / W, so the first step already learns (at peak / W) and step
  W - 1 reaches the peak; no step is spent at a rate of zero.
- decay over the steps after warmup (after the stable phase for wsd) towards `min_lr_ratio`, which
  it reaches at s = total_steps, one past the last step (so the last step does not train at the
  floor, which would waste it when the floor is zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ditty.config.errors import Problem, RecipeError
from ditty.config.sections import SchedulerConfig

if TYPE_CHECKING:
    import torch


@dataclass
class LRShape:
    """The learning-rate factor (a fraction of the peak) at each step; a function of the config."""

    kind: str
    total_steps: int
    warmup_steps: int
    min_lr_ratio: float
    decay_start: int
    """First step of the decay: the end of warmup, or of the stable phase for wsd."""

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant" or step < self.decay_start:
            return 1.0
        progress = min(1.0, (step - self.decay_start) / max(1, self.total_steps - self.decay_start))
        if self.kind == "cosine":
            return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0 - (1 - self.min_lr_ratio) * progress  # linear, and the decay of wsd


def lr_shape(sched: SchedulerConfig, total_steps: int) -> LRShape:
    """The shape `sched` describes over `total_steps` optimizer steps."""
    problems = check_scheduler(sched, total_steps)
    if problems:
        raise RecipeError(problems)
    decay_start = sched.warmup_steps
    if sched.kind == "wsd":
        decay_steps = round(sched.decay_fraction * total_steps)
        decay_start = max(sched.warmup_steps, total_steps - decay_steps)
    return LRShape(sched.kind, total_steps, sched.warmup_steps, sched.min_lr_ratio, decay_start)


def build_scheduler(
    sched: SchedulerConfig, optimizer: "torch.optim.Optimizer", total_steps: int
) -> "torch.optim.lr_scheduler.LRScheduler":
    """A LambdaLR (ClosedFormLR) over `optimizer` following `sched`; call `.step()` after each optimizer step."""
    from ditty.optim.closed_form import ClosedFormLR

    if total_steps < 1:
        raise ValueError(f"total_steps must be at least 1, got {total_steps}")
    return ClosedFormLR(optimizer, lr_lambda=lr_shape(sched, total_steps))


def check_scheduler(sched: SchedulerConfig, total_steps: Optional[int] = None) -> list[Problem]:
    """Problems with `[scheduler]`; those that need the run length only when `total_steps` is known
    (it is not at compile time when the run is given in epochs)."""
    problems = []
    for name in ("min_lr_ratio", "decay_fraction"):
        value = getattr(sched, name)
        if not 0.0 <= value <= 1.0:
            problems.append(Problem(key=f"scheduler.{name}", message=f"must be between 0 and 1, got {value}"))
    if sched.warmup_steps < 0:
        problems.append(Problem(key="scheduler.warmup_steps", message=f"must be >= 0, got {sched.warmup_steps}"))
    if total_steps is not None and sched.warmup_steps > total_steps:
        problems.append(
            Problem(
                key="scheduler.warmup_steps",
                message=f"{sched.warmup_steps} warmup steps are more than the run's {total_steps} steps: "
                "the rate would never reach its peak",
                fix=f"use at most {total_steps} (a few percent of the run is usual)",
            )
        )
    return problems
