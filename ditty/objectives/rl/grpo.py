"""GRPO and its variants as pure functions: group-normalised advantages, and the token-level clipped
policy loss with DAPO's clip-higher, GSPO's sequence-level importance ratio, the k3 KL estimator,
and three normalisations (GRPO per sequence, DAPO per token, Dr. GRPO by a constant). Defaults and
metric names are TRL's GRPOConfig/GRPOTrainer's.

How the trainer plugs them in (`[rl] kind = "grpo"`):
1. After the rollouts of a step, gather every completion's total reward (`ditty.objectives.rewards.functions`)
   across ranks, in prompt order, each group of `group_size` completions of one prompt adjacent;
   `group_advantages` turns them into one advantage per completion (and the reward metrics); each
   rank keeps the slice of its own completions.
2. For each micro-batch: `token_logps` of the policy (ditty.objectives.logprobs, with gradients),
   the log-probabilities the rollouts were sampled with (`old_logps`, None when
   updates_per_rollout = 1: then the ratio is 1 and only its gradient matters) and, when beta > 0,
   the reference's. `loss_mask(scored, truncated, mask_truncated)` gives the tokens that count;
   `global_sequences` and `global_tokens` are the completions and the `loss_mask` tokens of the
   WHOLE global batch (summed over micro-batches and ranks before the forward).
3. `grpo_loss(...)`: the loss and metrics are this split's share; add them over micro-batches and
   all-reduce with SUM (ditty.objectives.output).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

import torch
from torch import Tensor

from ditty.objectives.output import Count, ObjectiveOutput, detached, share

ScaleRewards = Literal["group", "batch", "none"]
Importance = Literal["token", "sequence"]
LossNormalisation = Literal["grpo", "dapo", "dr_grpo"]

CLIP_LOW = 0.2
"""TRL's GRPOConfig.epsilon; `clip_high` defaults to the same (epsilon_high=None); DAPO suggests 0.28."""
ADVANTAGE_EPS = 1e-4
"""Added to the reward std before dividing, as TRL: a group whose rewards all agree gets advantage 0."""


@dataclass
class Advantages:
    advantages: Tensor
    """[N] one per completion, in the order of the rewards."""
    metrics: dict[str, Tensor] = field(default_factory=dict)
    """reward, reward_std, frac_reward_zero_std: values of the whole batch (not shares: computed once
    per step on the gathered rewards)."""


def group_advantages(
    rewards: Tensor, group_size: int, scale_rewards: ScaleRewards = "group", eps: float = ADVANTAGE_EPS
) -> Advantages:
    """(r - mean of its group) / (std + eps), from the rewards [N] of the whole global batch, the
    `group_size` completions of a prompt adjacent. The std is the group's ("group", GRPO), the
    whole batch's ("batch", PPO-lite) or none ("none", Dr. GRPO: no difficulty bias); std is the
    unbiased estimate, as TRL's."""
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{tuple(rewards.shape)} rewards do not split into groups of {group_size}")
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f'scale_rewards must be "group", "batch" or "none", not {scale_rewards!r}')
    grouped = rewards.reshape(-1, group_size)
    group_std = grouped.std(dim=1) if group_size > 1 else torch.zeros_like(grouped[:, 0])
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        centred = centred / (group_std[:, None] + eps)
    elif scale_rewards == "batch":
        batch_std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
        centred = centred / (batch_std + eps)
    metrics = {
        "reward": rewards.mean(),
        "reward_std": rewards.std() if rewards.numel() > 1 else rewards.new_zeros(()),
        "frac_reward_zero_std": torch.isclose(group_std, torch.zeros_like(group_std)).to(rewards.dtype).mean(),
    }
    return Advantages(centred.reshape(-1), detached(metrics))


def loss_mask(scored: Tensor, truncated: Optional[Tensor] = None, mask_truncated: bool = False) -> Tensor:
    """The completion tokens that take part in the loss [B, T] bool: `scored` (from token_logps),
    without the completions cut at max_new_tokens when `mask_truncated` (DAPO's overlong filtering:
    they still count as sequences, with no tokens)."""
    mask = scored.bool()
    if mask_truncated:
        if truncated is None:
            raise ValueError("mask_truncated needs the truncated flag of every completion")
        mask = mask & ~truncated.bool()[:, None]
    return mask


def grpo_loss(
    logps: Tensor,
    old_logps: Optional[Tensor],
    advantages: Tensor,
    mask: Tensor,
    *,
    global_sequences: Count,
    global_tokens: Count,
    reference_logps: Optional[Tensor] = None,
    beta: float = 0.0,
    clip_low: float = CLIP_LOW,
    clip_high: Optional[float] = None,
    importance: Importance = "token",
    loss: LossNormalisation = "dapo",
    max_new_tokens: Optional[int] = None,
    token_weights: Optional[Tensor] = None,
) -> ObjectiveOutput:
    """The clipped surrogate of PPO (Schulman et al. 2017) with group advantages (GRPO, Shao et al.
    2024): per token -min(w A, clip(w, 1 - clip_low, 1 + clip_high) A), plus beta times the k3
    estimate of KL(policy || reference), exp(q - p) - (q - p) - 1 with q the reference's logp.

    w is the importance ratio pi / pi_old: per token ("token"), or GSPO's per sequence
    exp(mean over the sequence's tokens of log pi - log pi_old) ("sequence", Zheng et al. 2025).
    Normalisation ("loss"): "grpo" averages each sequence over its tokens then over sequences;
    "dapo" averages over every token of the global batch (Yu et al. 2025); "dr_grpo" divides the
    token sum by sequences x max_new_tokens (Liu et al. 2025).

    logps, old_logps, reference_logps, mask: [B, T] aligned (masked positions must be finite);
    advantages: [B], or [B, T] per token (per-turn credit, with importance "token"). token_weights
    ([B, T] or [B, 1]): the sampler correction's weights of the surrogate
    (ditty.objectives.sampling.correction), applied before the KL term as TRL does.
    """
    if importance not in ("token", "sequence"):
        raise ValueError(f'importance must be "token" or "sequence", not {importance!r}')
    if loss not in ("grpo", "dapo", "dr_grpo"):
        raise ValueError(f'loss must be "grpo", "dapo" or "dr_grpo", not {loss!r}')
    if loss == "dr_grpo" and not max_new_tokens:
        raise ValueError('loss = "dr_grpo" divides by max_new_tokens: give it')
    if beta and reference_logps is None:
        raise ValueError("beta > 0 needs the reference model's log-probabilities")
    clip_high = clip_low if clip_high is None else clip_high
    mask = mask.to(logps.dtype)
    lengths = mask.sum(-1).clamp(min=1)
    old_logps = logps.detach() if old_logps is None else old_logps
    log_ratio = logps - old_logps
    if importance == "token":
        log_weight = log_ratio
    else:
        log_weight = ((log_ratio * mask).sum(-1) / lengths)[:, None]
    weight = torch.exp(log_weight)
    clipped = torch.clamp(weight, 1.0 - clip_low, 1.0 + clip_high)
    advantage = advantages.to(logps.dtype)
    advantage = advantage[:, None] if advantage.dim() == 1 else advantage  # per completion, or per token
    per_token = -torch.min(weight * advantage, clipped * advantage)
    if token_weights is not None:
        per_token = per_token * token_weights.to(per_token.dtype)
    metrics: dict[str, Tensor] = {}
    if beta:
        delta = reference_logps - logps
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + beta * kl
        metrics["kl"] = share(kl * mask, global_tokens)
    per_token = per_token * mask
    if loss == "grpo":
        value = share(per_token.sum(-1) / lengths, global_sequences)
    elif loss == "dapo":
        value = share(per_token, global_tokens)
    else:
        value = share(per_token, torch.as_tensor(global_sequences, dtype=logps.dtype) * max_new_tokens)

    low = (weight < 1.0 - clip_low) & (advantage < 0)
    high = (weight > 1.0 + clip_high) & (advantage > 0)
    for name, clipped_where in (("low", low), ("high", high), ("region", low | high)):
        if importance == "token":
            metrics[f"clip_ratio/{name}_mean"] = share(clipped_where.to(mask.dtype) * mask, global_tokens)
        else:
            metrics[f"clip_ratio/{name}_mean"] = share(clipped_where.to(mask.dtype), global_sequences)
    return ObjectiveOutput(value, detached(metrics))


def completion_metrics(
    lengths: Tensor, truncated: Tensor, global_sequences: Count
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(shares: completions/mean_length and completions/clipped_ratio, summed over splits;
    maxima: completions/max_length, reduced with MAX) of the completions' token counts [B] and
    truncated flags [B], with TRL's names."""
    lengths = lengths.to(torch.float64)
    shares = {
        "completions/mean_length": share(lengths, global_sequences),
        "completions/clipped_ratio": share(truncated.to(torch.float64), global_sequences),
    }
    maxima = {"completions/max_length": lengths.max() if lengths.numel() else lengths.new_zeros(())}
    return detached(shares), detached(maxima)
