"""When the loop logs, evaluates, scores with the harness and saves: the step arithmetic in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Due:
    """What happens after one step."""

    log: bool
    evaluate: bool
    harness: bool
    """lm-eval on the live model (the final model is scored after saving instead)."""
    save: bool
    """A periodic checkpoint (it still waits for a finite step, ditty.checkpoint.finite)."""


@dataclass(frozen=True)
class Cadence:
    log_every: int
    eval_every: int
    harness_every: int
    save_every: int

    @classmethod
    def of(cls, config: Any) -> "Cadence":
        """From the recipe: train.log_every, train.eval_every, eval.harness_every (when eval.harness_tasks
        are set) and checkpoint.every; 0 means never (evaluation still runs after the last step)."""
        harness = config.eval.harness_every if config.eval.harness_tasks else 0
        return cls(config.train.log_every, config.train.eval_every, harness, config.checkpoint.every)

    def at(self, step: int, *, last: bool, skipped: bool) -> Due:
        def every(n: int) -> bool:
            return n > 0 and step % n == 0

        return Due(
            log=skipped or last or every(self.log_every),
            evaluate=last or every(self.eval_every),
            harness=not last and every(self.harness_every),
            save=self.saves_at(step),
        )

    def saves_at(self, step: int) -> bool:
        """A periodic checkpoint after `step` (`checkpoint.every`; 0 means never)."""
        return self.save_every > 0 and step % self.save_every == 0
