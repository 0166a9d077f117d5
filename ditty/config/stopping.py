"""`train.stop_when`: end a run before `train.steps` once an evaluation meets a condition.

"val_exact_match >= 0.4" stops the first time an evaluation's held-out exact match reaches 0.4,
wherever that falls on a given seed and device: a "weak start" for the stages after SFT that is
weak to the same degree everywhere, where a fixed step count lands on either side of a loss
plateau. The condition is one `val_*` metric, `>=` or `<=`, and a number; it is checked after
every evaluation (the start's too, with `train.eval_at_start`), and a run that meets it ends as at
its last step: the last checkpoint, final/, the report. Like Lightning's EarlyStopping
`stopping_threshold`; a patience rule (stop when a metric stops improving) is not offered.

The number may be relative to the run's own start, the evaluation at step 0: "val_exact_match <=
start - 0.2" stops a post-training stage as soon as it has lost 0.2 of what its start could do, and
"val_reward <= 0.8 * start" once it fell by a fifth (needs `train.eval_at_start`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional

from ditty.config.errors import RecipeError

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_CONDITION = re.compile(
    rf"^\s*(val_[A-Za-z0-9_/.-]+)\s*(>=|<=)\s*"
    rf"(?:(?P<number>{_NUMBER})|start\s*(?P<sign>[-+])\s*(?P<offset>{_NUMBER})|(?P<factor>{_NUMBER})\s*\*\s*start)\s*$"
)
EXAMPLE = '"val_exact_match >= 0.4", "val_loss <= 0.2" or "val_exact_match <= start - 0.2"'


@dataclass(frozen=True)
class StopCondition:
    metric: str
    at_least: bool
    """True for `>=`, False for `<=`."""
    threshold: float
    """The number; relative to the start's value when `relative` is set."""
    relative: str = ""
    """"": an absolute threshold; "offset": start + threshold; "factor": threshold * start."""

    def __str__(self) -> str:
        op = ">=" if self.at_least else "<="
        if self.relative == "offset":
            return f"{self.metric} {op} start {'-' if self.threshold < 0 else '+'} {abs(self.threshold):g}"
        if self.relative == "factor":
            return f"{self.metric} {op} {self.threshold:g} * start"
        return f"{self.metric} {op} {self.threshold:g}"

    def bound(self, start: Optional[dict[str, Any]]) -> float:
        """The threshold this run compares with: the number, or the number applied to its start's value."""
        if not self.relative:
            return self.threshold
        if not start or self.metric not in start:
            raise RecipeError.single(
                f"train.stop_when = {str(self)!r} compares with the start's {self.metric}, and this run has no "
                "evaluation at step 0 that reports it",
                key="train.stop_when",
                fix="set train.eval_at_start = true, or give a number instead of start",
            )
        value = float(start[self.metric])
        return value + self.threshold if self.relative == "offset" else value * self.threshold

    def met(self, metrics: dict[str, Any], start: Optional[dict[str, Any]] = None) -> Optional[str]:
        """What was met ("val_exact_match 0.445 >= 0.4"), or None. An evaluation without the
        metric is a RecipeError naming the ones it has: the run could never stop as asked.
        `start`: the evaluation at step 0, which a relative threshold reads."""
        if self.metric not in metrics:
            reported = ", ".join(sorted(k for k in metrics if k.startswith("val_"))) or "none"
            raise RecipeError.single(
                f"train.stop_when = {str(self)!r} reads {self.metric}, which this run's evaluation does not "
                f"report (it reports: {reported})",
                key="train.stop_when",
                fix="name one of the reported metrics",
            )
        value, threshold = float(metrics[self.metric]), self.bound(start)
        hit = value >= threshold if self.at_least else value <= threshold
        shown = f"{threshold:.4g}" + (f" ({self})" if self.relative else "")
        return f"{self.metric} {value:.4g} {'>=' if self.at_least else '<='} {shown}" if hit else None


def parse_stop_condition(text: str) -> Optional[StopCondition]:
    """The condition of `train.stop_when` ("" -> None); a ValueError says what is wrong."""
    if not text.strip():
        return None
    match = _CONDITION.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not METRIC >= NUMBER or METRIC <= NUMBER (NUMBER may be start - 0.2 or 0.8 * start), "
            "METRIC a val_* metric"
        )
    if match["number"] is not None:
        threshold, relative = float(match["number"]), ""
    elif match["offset"] is not None:
        threshold, relative = float(match["offset"]) * (-1 if match["sign"] == "-" else 1), "offset"
    else:
        threshold, relative = float(match["factor"]), "factor"
    if not math.isfinite(threshold):
        raise ValueError(f"{text!r}: the threshold must be a finite number")
    return StopCondition(match.group(1), match.group(2) == ">=", threshold, relative)
