"""A post-training stage that undoes its start says so, at the evaluation that shows it.

The stages after SFT evaluate at step 0 (`train.eval_at_start`), so each later evaluation can be read
against what the start could do. When the headline held-out metric (exact match, the held-out reward,
a reward model's pair accuracy) has fallen well below the start's, the most common cause is a learning
rate above what the start can take (ditty.recipe.start_rules says why): the run warns once, naming the
fall, `optimizer.lr` and how to stop on such a fall (`train.stop_when = "METRIC <= start - 0.2"`).
"""

from __future__ import annotations

from typing import Any, Optional

HEADLINE = ("val_exact_match", "val_reward", "val_accuracy")
"""The metric a fall is read on: the first of these the evaluation reports (higher is better)."""
FALL = 0.1
"""A fall is at least this much below the start (absolute) ..."""
SHARE = 0.2
"""... and at least this share of the start's value."""


def fall_warning(start: dict[str, Any], now: dict[str, Any], step: int, lr: float) -> Optional[str]:
    """The warning for an evaluation at `step` whose headline metric fell well below the start's, or None."""
    metric = next((m for m in HEADLINE if m in start and m in now), None)
    if metric is None:
        return None
    before, after = float(start[metric]), float(now[metric])
    if not (before - after >= FALL and after <= (1 - SHARE) * before):
        return None
    return (
        f"held-out {metric} fell from {before:.3f} at step 0 to {after:.3f} at step {step}: this stage is moving "
        f"its start away from what it could do. The most common cause is a learning rate above what the start can "
        f"take (optimizer.lr is {lr:g}): a model trained to the end of a decaying schedule takes about the rate it "
        "finished at (ditty check warns when it can read that rate). Lower optimizer.lr, or stop on such a fall "
        f'with train.stop_when = "{metric} <= start - 0.2"'
    )
