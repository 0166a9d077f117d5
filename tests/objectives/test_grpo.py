"""GRPO objectives (ditty.objectives.rl.grpo): one step on fixed rollouts (rewards, old, new and
reference log-probabilities given) equals each paper's formula, written here independently with
Python's math module token by token; any split of the sequences with the global counts gives the
same loss, metrics and gradients."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from ditty.objectives.rl.grpo import completion_metrics, group_advantages, grpo_loss, loss_mask

# Four completions (two prompts x two), five positions each; 1 marks a completion token.
MASK = [[0, 1, 1, 1, 0], [0, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 1, 1, 1, 1]]
NEW = [
    [0.0, -1.2, -0.4, -2.0, 0.0],
    [0.0, -0.3, -0.9, -1.1, -0.2],
    [0.0, 0.0, -2.5, -0.1, 0.0],
    [0.0, -0.7, -0.05, -1.6, -3.0],
]
OLD = [
    [0.0, -1.0, -0.8, -1.5, 0.0],
    [0.0, -0.35, -0.6, -1.4, -0.1],
    [0.0, 0.0, -2.0, -0.3, 0.0],
    [0.0, -1.1, -0.05, -1.2, -2.6],
]
REF = [
    [0.0, -1.1, -0.5, -1.9, 0.0],
    [0.0, -0.4, -1.0, -1.0, -0.3],
    [0.0, 0.0, -2.2, -0.2, 0.0],
    [0.0, -0.9, -0.1, -1.5, -2.9],
]
ADV = [1.3, -0.6, -1.1, 0.4]
SEQUENCES, MAX_NEW = 4, 6


def t(values, grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


def token_term(new, old, ref, adv, weight, low, high, beta):
    """-min(w A, clip(w) A) + beta * k3 for one token, w given."""
    clipped = min(max(weight, 1 - low), 1 + high)
    term = -min(weight * adv, clipped * adv)
    if beta:
        term += beta * (math.exp(ref - new) - (ref - new) - 1)
    return term


def expected_loss(loss, importance, low=0.2, high=0.2, beta=0.0):
    per_sequence, total, tokens = [], 0.0, 0
    for row in range(SEQUENCES):
        cols = [c for c in range(5) if MASK[row][c]]
        if importance == "sequence":
            seq_w = math.exp(sum(NEW[row][c] - OLD[row][c] for c in cols) / len(cols))
        terms = [
            token_term(
                NEW[row][c],
                OLD[row][c],
                REF[row][c],
                ADV[row],
                seq_w if importance == "sequence" else math.exp(NEW[row][c] - OLD[row][c]),
                low,
                high,
                beta,
            )
            for c in cols
        ]
        per_sequence.append(sum(terms) / len(terms))
        total += sum(terms)
        tokens += len(terms)
    if loss == "grpo":
        return sum(per_sequence) / SEQUENCES
    if loss == "dapo":
        return total / tokens
    return total / (SEQUENCES * MAX_NEW)


def run(loss, importance, rows=slice(0, 4), low=0.2, high=None, beta=0.0, old=True):
    new = t(NEW, grad=True)
    out = grpo_loss(
        new[rows],
        t(OLD)[rows] if old else None,
        t(ADV)[rows],
        t(MASK)[rows].bool(),
        global_sequences=SEQUENCES,
        global_tokens=int(t(MASK).sum()),
        reference_logps=t(REF)[rows],
        beta=beta,
        clip_low=low,
        clip_high=high,
        importance=importance,
        loss=loss,
        max_new_tokens=MAX_NEW,
    )
    out.loss.backward()
    return out, new.grad


@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("importance", ["token", "sequence"])
@pytest.mark.parametrize("low,high,beta", [(0.2, None, 0.0), (0.2, 0.28, 0.0), (0.1, 0.28, 0.04)])
def test_every_variant_equals_the_papers_formula(loss, importance, low, high, beta):
    out, _ = run(loss, importance, low=low, high=high, beta=beta)
    want = expected_loss(loss, importance, low, low if high is None else high, beta)
    assert abs(out.loss.item() - want) < 1e-6


def test_the_fixture_exercises_both_clips():
    """The ratios leave the trust region on both sides, and clip-higher changes which tokens clip."""
    symmetric, _ = run("dapo", "token", low=0.2, high=None)
    wider, _ = run("dapo", "token", low=0.2, high=0.6)
    assert symmetric.metrics["clip_ratio/low_mean"].item() > 0
    assert symmetric.metrics["clip_ratio/high_mean"].item() > 0
    assert wider.metrics["clip_ratio/high_mean"].item() < symmetric.metrics["clip_ratio/high_mean"].item()
    assert symmetric.loss.item() != wider.loss.item()


def test_clip_fraction_and_kl_metrics_equal_their_definitions():
    out, _ = run("dapo", "token", beta=0.04)
    low = high = kl = 0.0
    tokens = sum(map(sum, MASK))
    for row in range(SEQUENCES):
        for c in range(5):
            if not MASK[row][c]:
                continue
            w = math.exp(NEW[row][c] - OLD[row][c])
            low += (w < 0.8 and ADV[row] < 0) / tokens
            high += (w > 1.2 and ADV[row] > 0) / tokens
            kl += (math.exp(REF[row][c] - NEW[row][c]) - (REF[row][c] - NEW[row][c]) - 1) / tokens
    assert abs(out.metrics["clip_ratio/low_mean"].item() - low) < 1e-12
    assert abs(out.metrics["clip_ratio/high_mean"].item() - high) < 1e-12
    assert abs(out.metrics["clip_ratio/region_mean"].item() - (low + high)) < 1e-12
    assert abs(out.metrics["kl"].item() - kl) < 1e-12


def test_on_policy_step_is_the_advantage_weighted_log_likelihood_gradient():
    """updates_per_rollout = 1: old = new (no ratio), the loss is -mean A and d loss / d logp = -A / tokens."""
    out, grad = run("dapo", "token", old=False)
    tokens = sum(map(sum, MASK))
    assert abs(out.loss.item() + sum(ADV[r] * sum(MASK[r]) for r in range(4)) / tokens) < 1e-12
    expected = torch.tensor([[-ADV[r] * MASK[r][c] / tokens for c in range(5)] for r in range(4)], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("importance", ["token", "sequence"])
def test_split_invariance(loss, importance):
    whole, whole_grad = run(loss, importance, beta=0.04, high=0.28)
    parts = [run(loss, importance, rows=rows, beta=0.04, high=0.28) for rows in (slice(0, 1), slice(1, 4))]
    assert abs(sum(p.loss.item() for p, _ in parts) - whole.loss.item()) < 1e-12
    for name, value in whole.metrics.items():
        assert abs(sum(p.metrics[name].item() for p, _ in parts) - value.item()) < 1e-12, name
    torch.testing.assert_close(parts[0][1] + parts[1][1], whole_grad, atol=1e-12, rtol=0)


REWARDS = [1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 2.0, 1.0, 0.0]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_equal_the_definition(scale):
    size = 4
    out = group_advantages(t(REWARDS), size, scale)
    expected = []
    for start in range(0, len(REWARDS), size):
        group = REWARDS[start : start + size]
        for reward in group:
            centred = reward - statistics.mean(group)
            if scale == "group":
                centred /= statistics.stdev(group) + 1e-4
            elif scale == "batch":
                centred /= statistics.stdev(REWARDS) + 1e-4
            expected.append(centred)
    torch.testing.assert_close(out.advantages, t(expected), atol=1e-12, rtol=0)
    assert out.advantages[4:8].abs().max().item() == 0  # a group that agrees teaches nothing
    assert abs(out.metrics["reward"].item() - statistics.mean(REWARDS)) < 1e-12
    assert abs(out.metrics["reward_std"].item() - statistics.stdev(REWARDS)) < 1e-12
    assert abs(out.metrics["frac_reward_zero_std"].item() - 1 / 3) < 1e-12


def test_advantages_refuse_a_batch_that_is_not_whole_groups():
    with pytest.raises(ValueError, match="groups of 5"):
        group_advantages(t(REWARDS), 5)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(t(REWARDS), 4, "per-group")


def test_mask_truncated_removes_the_tokens_but_keeps_the_sequence():
    scored = t(MASK).bool()
    truncated = torch.tensor([False, True, False, False])
    mask = loss_mask(scored, truncated, mask_truncated=True)
    assert not mask[1].any() and torch.equal(mask[0], scored[0])
    assert torch.equal(loss_mask(scored, truncated, mask_truncated=False), scored)
    new = t(NEW, grad=True)
    out = grpo_loss(new, t(OLD), t(ADV), mask, global_sequences=4, global_tokens=int(mask.sum()), loss="grpo")
    out.loss.backward()
    assert new.grad[1].abs().max().item() == 0  # a truncated completion gets no gradient
    with pytest.raises(ValueError, match="truncated flag"):
        loss_mask(scored, None, mask_truncated=True)


def test_dr_grpo_needs_max_new_tokens_and_beta_needs_a_reference():
    with pytest.raises(ValueError, match="max_new_tokens"):
        grpo_loss(t(NEW), None, t(ADV), t(MASK), global_sequences=4, global_tokens=13, loss="dr_grpo")
    with pytest.raises(ValueError, match="reference"):
        grpo_loss(t(NEW), None, t(ADV), t(MASK), global_sequences=4, global_tokens=13, beta=0.1)


def test_completion_metrics():
    shares, maxima = completion_metrics(torch.tensor([3, 4, 6]), torch.tensor([False, False, True]), 6)
    assert shares["completions/mean_length"].item() == 13 / 6
    assert shares["completions/clipped_ratio"].item() == 1 / 6
    assert maxima["completions/max_length"].item() == 6
