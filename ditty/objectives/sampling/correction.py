"""The sampler/trainer mismatch and its off-policy correction (`rollout.sampler_correction`), as TRL's
GRPOTrainer computes them for vLLM rollouts (`vllm_importance_sampling_correction`).

A sampler with weights and numerics of its own (a vLLM engine; one update behind under
rollout.max_staleness = 1) draws completions from a distribution a little off the policy being trained.
Per completion token, d = log pi_trainer - log pi_sampler, with pi_trainer scored by the training
forward's path when the rollouts are assembled (before this step's update) and pi_sampler what the
sampler reported:
- "tis" (TRL's "token_truncate"): each token's loss is multiplied by min(exp(d), cap);
- "mis" (TRL's "sequence_mask"): each completion's by exp(sum of its d), or 0 where that exceeds the cap.
The weight multiplies the clipped surrogate before the KL term is added (as TRL). `rollout/logprob_diff`
(mean and max of |d|) is logged whenever the sampler reports log-probabilities.
"""

from __future__ import annotations

import torch
from torch import Tensor


def log_ratio(trainer_logps: Tensor, sampler_logps: Tensor, mask: Tensor) -> Tensor:
    """d per token [B, T], 0 off the mask (and where the sampler reported NaN: no correction there)."""
    return torch.nan_to_num((trainer_logps - sampler_logps) * mask.to(trainer_logps.dtype), nan=0.0)


def correction_weights(trainer_logps: Tensor, sampler_logps: Tensor, mask: Tensor, kind: str, cap: float) -> Tensor:
    """The weight of each token's loss [B, T] ("tis") or of each completion's [B, 1] ("mis")."""
    diff = log_ratio(trainer_logps, sampler_logps, mask)
    if kind == "tis":
        return torch.exp(diff).clamp(max=cap)
    if kind == "mis":
        ratio = torch.exp(diff.sum(-1, keepdim=True))
        return ratio.masked_fill(ratio > cap, 0.0)
    raise ValueError(f'sampler_correction must be "tis" or "mis" here, not {kind!r}')


def mismatch_totals(trainer_logps: Tensor, sampler_logps: Tensor, mask: Tensor) -> Tensor:
    """[sum of |d|, tokens, max of |d|] over the mask (float64): a micro-batch's part of
    rollout/logprob_diff, added up (the first two) and maxed (the last) over micro-batches and ranks."""
    scored = mask.bool() & ~torch.isnan(sampler_logps)
    delta = (trainer_logps.double() - sampler_logps.double()).abs()[scored]
    if delta.numel() == 0:
        return torch.zeros(3, dtype=torch.float64)
    return torch.stack([delta.sum(), torch.tensor(float(delta.numel()), dtype=torch.float64), delta.max()])
