"""The environment: what a completion earns. Today's reward functions are its one-turn case: the
completion ends the episode and every function scores it (`RewardEnvironment`).

`score(rollouts, prompts, columns)` fills a `RolloutBatch`'s rewards: the weighted sum per row, each
function's own values (logged as rewards/NAME/mean and /std) and the extra values a function reports.
A function that fails stops the run with exit code 2 before any update (ditty.objectives.rewards).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ditty.objectives.rewards import RewardFunction, score_completions
from ditty.objectives.rl.batch import RolloutBatch


class RewardEnvironment:
    """One turn: the reward functions (TRL's signature) score each completion with its prompt row's columns."""

    def __init__(self, functions: Sequence[RewardFunction], timeout_s: float = 0.0) -> None:
        self.functions = list(functions)
        self.timeout_s = timeout_s  # rl.reward_timeout_s: a function that runs longer stops the run (exit 2)

    def score(self, rollouts: RolloutBatch, prompts: Sequence[Any], columns: Mapping[str, Sequence[Any]]) -> None:
        """`prompts` and `columns` hold one entry per row of `rollouts` (a group's prompt repeated)."""
        scores = score_completions(self.functions, prompts, rollouts.texts, columns, timeout_s=self.timeout_s)
        rollouts.rewards = scores.total
        rollouts.rewards_per_function = scores.per_function
        rollouts.reward_details = scores.details
