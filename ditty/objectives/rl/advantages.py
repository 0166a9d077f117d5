"""Advantage estimators: a completion's reward -> its advantage, over the rewards of the WHOLE global
batch (every rank's, in global prompt order, a group's completions adjacent).

`GroupAdvantage` is GRPO's (ditty.objectives.grpo.group_advantages): the reward minus its group's
mean, divided by the group's (or the batch's) std unless `rl.scale_rewards = "none"`.
"""

from __future__ import annotations

from torch import Tensor

from ditty.objectives.grpo import Advantages, group_advantages


class GroupAdvantage:
    def __init__(self, rl) -> None:
        self.group_size, self.scale_rewards = rl.group_size, rl.scale_rewards

    def __call__(self, rewards: Tensor) -> Advantages:
        return group_advantages(rewards, self.group_size, self.scale_rewards)
