"""The sampler/trainer mismatch and its correction (ditty.objectives.sampling.correction) against TRL's
formula: GRPOTrainer._generate_and_score_completions (trl 1.16, trl/trainer/grpo_trainer.py, the
`vllm_importance_sampling_correction` block) computes the ratio written out in `trl_ratio` below, with
old_per_token_logps the trainer's and sampling_per_token_logps vLLM's; "tis" is its "token_truncate",
"mis" its "sequence_mask". The loss's use of the weights is checked against TRL's own `_compute_loss` in
tests/objectives/test_against_trl.py."""

from __future__ import annotations

import math

import pytest
import torch

from ditty.objectives.rl.grpo import grpo_loss
from ditty.objectives.sampling.correction import correction_weights, mismatch_totals


def trl_ratio(old, sampling, mask, mode, clip_max, clip_min=None):
    """TRL's lines, as they are (variable names kept)."""
    per_token_logps_diff = (old - sampling) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)
    sequence_level_is = mode in ["sequence_mask", "sequence_truncate"]
    if sequence_level_is:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        ratio = ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)
    return ratio


def logps(seed=0, rows=6, width=9):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for r in range(rows):
        mask[r, 2 : 3 + (r * 3) % (width - 2)] = 1
    trainer = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3
    sampler = trainer + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.6
    sampler[1, 3] = float("nan")  # a token the sampler did not score
    return trainer, sampler, mask


@pytest.mark.parametrize("cap", [1.5, 3.0])
@pytest.mark.parametrize("kind,mode", [("tis", "token_truncate"), ("mis", "sequence_mask")])
def test_the_correction_is_trls(kind, mode, cap):
    trainer, sampler, mask = logps()
    want = trl_ratio(trainer, sampler, mask, mode, cap)
    got = correction_weights(trainer, sampler, mask.bool(), kind, cap)
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    if kind == "mis":  # some completions masked, some kept: the case is not vacuous
        assert 0 < int((got == 0).sum()) < got.shape[0]
    else:
        assert (got == cap).any() and (got < 1).any()


def test_the_weights_multiply_the_surrogate_before_the_kl():
    trainer, sampler, mask = logps(seed=1)
    new = trainer.clone().requires_grad_(True)
    advantages = torch.linspace(-1, 1, trainer.shape[0], dtype=torch.float64)
    reference = trainer.detach() + 0.1
    weights = correction_weights(trainer, sampler, mask.bool(), "tis", 2.0)
    kwargs = dict(global_sequences=6, global_tokens=int(mask.sum()), reference_logps=reference, beta=0.04, loss="dapo")
    plain = grpo_loss(new, None, advantages, mask.bool(), **kwargs)
    corrected = grpo_loss(new, None, advantages, mask.bool(), token_weights=weights, **kwargs)
    delta = reference - trainer
    kl = (torch.exp(delta) - delta - 1) * mask
    surrogate = -advantages[:, None] * mask  # ratio 1 on-policy
    want = ((surrogate * weights + 0.04 * kl) * mask).sum() / mask.sum()
    assert corrected.loss.item() == pytest.approx(want.item(), abs=1e-12)
    assert plain.loss.item() != pytest.approx(corrected.loss.item())


def test_the_mismatch_is_the_mean_and_max_over_scored_tokens():
    trainer, sampler, mask = logps(seed=2)
    total, count, largest = mismatch_totals(trainer, sampler, mask.bool()).tolist()
    scored = mask.bool() & ~torch.isnan(sampler)
    delta = (trainer - sampler).abs()[scored]
    assert count == scored.sum().item()
    assert total / count == pytest.approx(delta.mean().item()) and largest == pytest.approx(delta.max().item())
    assert mismatch_totals(trainer, sampler, torch.zeros_like(mask).bool()).tolist() == [0.0, 0.0, 0.0]
