"""`train.stop_when`: end a run before `train.steps` once an evaluation meets a condition.

"val_exact_match >= 0.4" stops the first time an evaluation's held-out exact match reaches 0.4,
wherever that falls on a given seed and device: a "weak start" for the stages after SFT that is
weak to the same degree everywhere, where a fixed step count lands on either side of a loss
plateau. The condition is one `val_*` metric, `>=` or `<=`, and a number; it is checked after
every evaluation (the start's too, with `train.eval_at_start`), and a run that meets it ends as at
its last step: the last checkpoint, final/, the report. Like Lightning's EarlyStopping
`stopping_threshold`; a patience rule (stop when a metric stops improving) is not offered.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional

from ditty.config.errors import RecipeError

_CONDITION = re.compile(r"^\s*(val_[A-Za-z0-9_/.-]+)\s*(>=|<=)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
EXAMPLE = '"val_exact_match >= 0.4" or "val_loss <= 0.2"'


@dataclass(frozen=True)
class StopCondition:
    metric: str
    at_least: bool
    """True for `>=`, False for `<=`."""
    threshold: float

    def __str__(self) -> str:
        return f"{self.metric} {'>=' if self.at_least else '<='} {self.threshold:g}"

    def met(self, metrics: dict[str, Any]) -> Optional[str]:
        """What was met ("val_exact_match 0.445 >= 0.4"), or None. An evaluation without the
        metric is a RecipeError naming the ones it has: the run could never stop as asked."""
        if self.metric not in metrics:
            reported = ", ".join(sorted(k for k in metrics if k.startswith("val_"))) or "none"
            raise RecipeError.single(
                f"train.stop_when = {str(self)!r} reads {self.metric}, which this run's evaluation does not "
                f"report (it reports: {reported})",
                key="train.stop_when",
                fix="name one of the reported metrics",
            )
        value = float(metrics[self.metric])
        hit = value >= self.threshold if self.at_least else value <= self.threshold
        return f"{self.metric} {value:.4g} {'>=' if self.at_least else '<='} {self.threshold:g}" if hit else None


def parse_stop_condition(text: str) -> Optional[StopCondition]:
    """The condition of `train.stop_when` ("" -> None); a ValueError says what is wrong."""
    if not text.strip():
        return None
    match = _CONDITION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not METRIC >= NUMBER or METRIC <= NUMBER, METRIC a val_* metric")
    threshold = float(match.group(3))
    if not math.isfinite(threshold):
        raise ValueError(f"{text!r}: the threshold must be a finite number")
    return StopCondition(match.group(1), match.group(2) == ">=", threshold)
