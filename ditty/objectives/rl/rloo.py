"""The RLOO row (`[rl] advantage = "rloo"`): GRPO's parts with a leave-one-out baseline.

REINFORCE Leave-One-Out (Ahmadian et al. 2024, TRL's RLOOTrainer): each completion's advantage is its
reward minus the mean reward of the OTHER completions of its prompt,

    A_i = r_i - (sum_j r_j - r_i) / (G - 1) = G / (G - 1) * (r_i - mean_j r_j),

an unbiased baseline (a completion's own reward does not lower its advantage). `rl.scale_rewards`
applies as for GRPO: "none" leaves it as is (TRL's default), "group" divides by the std of the
group's rewards (+1e-4), "batch" standardises the advantages over the whole batch (TRL's
normalize_advantages). The sampler, environment, assembler and policy loss are GRPO's.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ditty.objectives.parts import ObjectiveParts
from ditty.objectives.rl.grpo import ADVANTAGE_EPS, Advantages, group_advantages


def leave_one_out_advantages(rewards: Tensor, group_size: int, scale_rewards: str = "none") -> Advantages:
    """RLOO's advantages of the rewards [N] of the whole global batch, a group's completions adjacent,
    with the reward metrics of `group_advantages` (reward, reward_std, frac_reward_zero_std)."""
    if group_size < 2:
        raise ValueError("a leave-one-out baseline needs at least 2 completions per prompt")
    metrics = group_advantages(rewards, group_size, "none").metrics
    grouped = rewards.reshape(-1, group_size)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    advantages = grouped - baseline
    if scale_rewards == "group":
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + ADVANTAGE_EPS)
    advantages = advantages.reshape(-1)
    if scale_rewards == "batch":
        spread = advantages.std() if advantages.numel() > 1 else advantages.new_zeros(())
        advantages = (advantages - advantages.mean()) / (spread + ADVANTAGE_EPS)
    return Advantages(advantages, metrics)


def build_rloo(run: Any) -> ObjectiveParts:
    """GRPO's parts; the estimator is `rl.advantage`'s, "rloo" (ditty.objectives.rl.estimators)."""
    from ditty.objectives.rl.row import build_rl

    return build_rl(run)
