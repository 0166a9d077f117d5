"""Checkpoints never hold a non-finite step.

A step whose loss or gradient is not finite is skipped by the trainer (the weights stay as they
were), and a streak of them usually means the run diverged: the weights may already be damaged by
the finite but huge update that came before. So while a streak lasts, no checkpoint is written (a
save that falls due waits for the next finite step), and the newest checkpoint written before the
streak began is kept even when `checkpoint.keep_last` would prune it, so a rerun can always go back
to it. When the run stops on the streak, the message names that checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .layout import step_name


class FiniteStepGate:
    """Decides, step by step, whether a save may happen now. One per `CheckpointManager`."""

    def __init__(self, manager) -> None:
        self.manager = manager
        self.pending = False
        """A save fell due during a streak and waits for the next finite step."""
        self.streak_start: Optional[int] = None
        self.before_streak: Optional[int] = None
        """The step of the newest checkpoint written before the current (or last) streak began."""

    @property
    def in_streak(self) -> bool:
        return self.streak_start is not None

    def observe(self, step: int, skipped: bool, last_saved: Optional[int]) -> None:
        """Call after each step with whether it was skipped and the step of the newest checkpoint."""
        if not skipped:
            self.streak_start = None
            return
        if self.streak_start is None:
            self.streak_start = step
            self.before_streak = last_saved
            if last_saved is not None:
                self.manager.protect(last_saved)

    def save_now(self, due: bool) -> bool:
        """Whether to save at this step: it is `due` (or an earlier save waits) and the step is finite."""
        self.pending = self.pending or due
        if not self.pending or self.in_streak:
            return False
        self.pending = False
        return True

    def last_good(self, run_dir: str) -> str:
        """Where a rerun resumes from, in words, for the message that stops a run on a streak."""
        if self.before_streak is None:
            return (
                f"no checkpoint was written before the streak began (step {self.streak_start}): "
                "a rerun starts from step 0"
            )
        path = Path(run_dir) / "checkpoints" / step_name(self.before_streak)
        return (
            f"the newest checkpoint from before the streak (it began at step {self.streak_start}) is {path}; "
            "no checkpoint was written during the streak, so a rerun resumes from it"
        )
