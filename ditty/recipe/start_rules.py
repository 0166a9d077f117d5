"""A post-training stage's learning rate against the rate its start finished training at.

Adam moves every weight by about the learning rate at each step, whatever the gradient's size, and
its first step moves each one by the full rate. A model trained to the end of a decaying schedule
has settled where steps of its final rate keep it; a post-training stage (GRPO, DPO, distillation,
...) at several times that rate moves it out of what it learned, within a few steps: one GRPO step
at 3x the rate the start ended at took held-out exact match from 0.97 to 0.08, and the samples a
policy gradient learns from went with it (docs/benchmarks/2026-12-07-grpo-starts.md). So when the
start is a ditty run's final/, its last learning rate is read (the run's metrics.jsonl, else its
recipe's schedule) and a stage that starts above it is warned, before any weight loads.

Full finetuning with an Adam whose first steps are whole-rate steps only: an adapter starts at zero
and trains parameters of its own, and RAdam's first steps are momentum-SGD steps the size of the
gradient, its adaptive steps growing from a fraction of the rate as its variance estimate firms up
(tiny_grpo at RAdam 6x the rate its finished start ended at: 0.97, lowest 0.88, 0.97 after 100 steps).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator, Optional

from ditty.config.errors import Problem
from ditty.recipe.rules import Context, rule, warning

RECTIFIED = ("radam",)
"""Optimizers whose first steps are not whole-rate steps (see the module doc): not warned."""
TOLERANCE = 1.05
"""A stage up to this factor above the start's last rate is not warned (rounding of logged rates)."""


@rule("start.lr")
def start_learning_rate(ctx: Context) -> Iterator[Problem]:
    """A post-training stage whose learning rate is above the one its start (a ditty run's final/)
    finished training at: it undoes what the start learned."""
    from ditty.objectives.table import objective_for

    cfg = ctx.config
    if not cfg.model.path or cfg.peft.kind != "none" or not objective_for(cfg).post_training:
        return
    if cfg.optimizer.kind in RECTIFIED:
        return
    ended = finished_learning_rate(cfg.model.path)
    if ended is None:
        return
    rate, where = ended
    if rate <= 0 or cfg.optimizer.lr <= rate * TOLERANCE:
        return
    yield warning(
        "optimizer.lr",
        f"is {cfg.optimizer.lr:g}, {cfg.optimizer.lr / rate:.1f}x the learning rate its start {cfg.model.path} "
        f"finished training at ({rate:.3g}, {where}); every Adam step moves each weight by about the rate, so a "
        "start trained to the end of its schedule is moved out of what it learned in a few steps (held-out "
        "results fall, and a policy gradient loses the right answers it learns from)",
        f"set optimizer.lr to {rate:.3g} or below (with a warmup: scheduler.warmup_steps), or start from a "
        "model stopped before its schedule decayed",
    )


def finished_learning_rate(path: str) -> Optional[tuple[float, str]]:
    """(the last learning rate of the run whose final/ is `path`, where it was read), or None when
    `path` is not a ditty run's final/ (a hub model, a plain directory) or says nothing of it."""
    final = Path(path)
    recipe = final / "recipe.toml"
    if not recipe.is_file():
        return None
    metrics = final.parent / "metrics.jsonl"
    logged = _last_logged_rate(metrics)
    if logged is not None:
        return logged, f"the last lr in {metrics}"
    scheduled = _scheduled_final_rate(recipe)
    if scheduled is not None:
        return scheduled, f"the end of the schedule in {recipe}"
    return None


def _last_logged_rate(metrics: Path) -> Optional[float]:
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            value = json.loads(line).get("lr")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def _scheduled_final_rate(recipe: Path) -> Optional[float]:
    """The rate of the last step of the recipe's schedule (a run that ran to train.steps)."""
    import tomllib

    from ditty.config.errors import RecipeError
    from ditty.config.sections import SchedulerConfig
    from ditty.optim.scheduler import lr_shape

    try:
        doc: dict[str, Any] = tomllib.loads(recipe.read_text(encoding="utf-8"))
        lr = float(doc["optimizer"]["lr"])
        steps = int(doc["train"]["steps"])
        known = {f for f in SchedulerConfig.__dataclass_fields__}
        scheduler = SchedulerConfig(**{k: v for k, v in doc.get("scheduler", {}).items() if k in known})
        return lr * lr_shape(scheduler, steps)(steps - 1)
    except (OSError, ValueError, KeyError, TypeError, RecipeError):  # a recipe this does not read
        return None
