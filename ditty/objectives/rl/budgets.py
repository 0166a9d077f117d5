"""A sampling budget that cuts most samples says so in the run's first rollouts.

A completion that reaches `rollout.max_new_tokens` before its end-of-sequence token is cut
(`completions/clipped_ratio`); an episode is also cut at `rl.max_episode_tokens` or after
`rl.max_turns` turns (`env/truncated`). A few cut samples are normal; most of them, from the first
steps, mean a budget too small for the task (a tool call longer than the turn allows), which the
metrics show but nothing else points at. The stream reads the share over its first rollouts and warns
once, naming the keys and their values. A model that has not learned to stop yet (a random init) is
cut as well: the warning says that too.
"""

from __future__ import annotations

from typing import Any, Optional

FIRST_ROLLOUTS = 3
"""The rollouts whose mean share is read (the budget is the recipe's, so the first ones tell)."""
SHARE = 0.5
"""Warn when at least this share of the samples were cut."""


class BudgetWatch:
    """`observe(metrics)` after each rollout: the warning's text once, at the FIRST_ROLLOUTS-th, else None."""

    def __init__(self, rl: Any, rollout: Any) -> None:
        self.rl, self.rollout = rl, rollout
        self.shares: list[float] = []

    def observe(self, metrics: dict[str, float]) -> Optional[str]:
        if len(self.shares) >= FIRST_ROLLOUTS:
            return None
        self.shares.append(float(metrics.get("completions/clipped_ratio", 0.0)))
        if len(self.shares) < FIRST_ROLLOUTS:
            return None
        share = sum(self.shares) / len(self.shares)
        if share < SHARE:
            return None
        first = f"{share:.0%} of the samples of the first {FIRST_ROLLOUTS} rollouts were cut"
        untrained = " (a model that has not learned to end its answers is cut too)"
        if self.rl.plays_episodes:
            return (
                f"{first} before their episode ended{untrained}: a model turn at rollout.max_new_tokens = "
                f"{self.rollout.max_new_tokens}, an episode at rl.max_episode_tokens = {self.rl.max_episode_tokens} "
                f"or after rl.max_turns = {self.rl.max_turns} turns (env/truncated, env/turns and "
                "completions/mean_length say which). Raise the one the episodes reach"
            )
        return (
            f"{first} at rollout.max_new_tokens = {self.rollout.max_new_tokens}{untrained}; "
            "completions/clipped_ratio counts them. Raise rollout.max_new_tokens to fit a whole answer"
        )
