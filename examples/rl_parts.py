"""An advantage estimator and a policy loss of one's own, written against ditty.rl's interfaces.

Both reimplement a built-in (GRPO's group advantages, DAPO's token-level clipped surrogate), so a run
with them gives the built-in run's losses; start from them to try an idea of your own:

    ditty run tiny_grpo --rl.advantage examples.rl_parts:group_advantages --rl.loss examples.rl_parts:dapo_loss

(from the project's root, so that `examples` imports). Each is checked by the compiler before any
weight loads (it imports, and takes the arguments ditty calls it with), and passes the checks every
built-in part passes: `ditty.rl.check_advantage_estimator`, `ditty.rl.check_policy_loss`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ditty.rl import ObjectiveOutput, share


def group_advantages(rewards: Tensor, group_size: int, lengths: Tensor) -> Tensor:
    """GRPO: each reward less its group's mean, over its group's (unbiased) std plus 1e-4."""
    grouped = rewards.reshape(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    return (centred / (grouped.std(dim=1, keepdim=True) + 1e-4)).reshape(-1)


def dapo_loss(
    logps: Tensor,
    old_logps: Optional[Tensor],
    advantages: Tensor,
    mask: Tensor,
    *,
    global_sequences,
    global_tokens,
    reference_logps: Optional[Tensor],
    beta: float,
    clip_low: float,
    clip_high: Optional[float],
    importance: str,
    max_new_tokens: Optional[int],
    token_weights: Optional[Tensor],
) -> ObjectiveOutput:
    """DAPO: PPO's clipped surrogate per token, with clip-higher, averaged over every token of the
    global batch; beta times the k3 KL to the reference added per token."""
    if importance != "token":
        raise ValueError("this loss weighs each token by its own ratio")
    mask = mask.to(logps.dtype)
    old = logps.detach() if old_logps is None else old_logps
    ratio = torch.exp(logps - old)
    high = clip_low if clip_high is None else clip_high
    advantage = advantages.to(logps.dtype)
    advantage = advantage[:, None] if advantage.dim() == 1 else advantage
    per_token = -torch.min(ratio * advantage, torch.clamp(ratio, 1 - clip_low, 1 + high) * advantage)
    if token_weights is not None:  # the sampler correction's weights (rollout.sampler_correction)
        per_token = per_token * token_weights.to(per_token.dtype)
    if beta:
        delta = reference_logps - logps
        per_token = per_token + beta * (torch.exp(delta) - delta - 1)
    return ObjectiveOutput(share(per_token * mask, global_tokens))
