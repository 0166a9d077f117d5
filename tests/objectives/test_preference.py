"""Preference losses (ditty.objectives.dpo_family, reward_model): one step on fixed log-probabilities
equals each paper's formula, written here independently with Python's math module, pair by pair;
any split of the pairs with the global count gives the same loss, metrics and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from ditty.objectives.dpo_family import dpo_loss, ipo_loss, kto_kl, kto_kl_share, kto_loss, orpo_loss, simpo_loss
from ditty.objectives.reward_model import bradley_terry_loss

# Six pairs: summed completion log-probabilities of a policy and of a DIFFERENT reference model.
POLICY_CHOSEN = [-12.5, -3.25, -20.0, -7.75, -1.5, -9.0]
POLICY_REJECTED = [-14.0, -2.5, -25.5, -7.0, -4.25, -9.5]
REFERENCE_CHOSEN = [-13.0, -3.0, -21.5, -8.0, -2.0, -8.5]
REFERENCE_REJECTED = [-13.5, -3.5, -24.0, -6.5, -3.75, -10.0]
CHOSEN_LENGTHS = [5, 2, 9, 4, 1, 6]
REJECTED_LENGTHS = [6, 3, 11, 3, 2, 6]
PAIRS = len(POLICY_CHOSEN)


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def t(values, grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


def policy():
    return t(POLICY_CHOSEN, grad=True), t(POLICY_REJECTED, grad=True)


def mean(values):
    return sum(values) / len(values)


@pytest.mark.parametrize("beta,smoothing", [(0.1, 0.0), (0.5, 0.2)])
def test_dpo_equals_the_paper(beta, smoothing):
    expected = []
    for pc, pr, rc, rr in zip(POLICY_CHOSEN, POLICY_REJECTED, REFERENCE_CHOSEN, REFERENCE_REJECTED):
        h = beta * ((pc - rc) - (pr - rr))
        expected.append(-(1 - smoothing) * log_sigmoid(h) - smoothing * log_sigmoid(-h))
    chosen, rejected = policy()
    out = dpo_loss(
        chosen,
        rejected,
        t(REFERENCE_CHOSEN),
        t(REFERENCE_REJECTED),
        global_pairs=PAIRS,
        beta=beta,
        label_smoothing=smoothing,
    )
    assert abs(out.loss.item() - mean(expected)) < 1e-6
    chosen_rewards = [beta * (pc - rc) for pc, rc in zip(POLICY_CHOSEN, REFERENCE_CHOSEN)]
    rejected_rewards = [beta * (pr - rr) for pr, rr in zip(POLICY_REJECTED, REFERENCE_REJECTED)]
    want = {
        "rewards/chosen": mean(chosen_rewards),
        "rewards/rejected": mean(rejected_rewards),
        "rewards/margins": mean([c - r for c, r in zip(chosen_rewards, rejected_rewards)]),
        "rewards/accuracies": mean([float(c > r) for c, r in zip(chosen_rewards, rejected_rewards)]),
        "logps/chosen": mean(POLICY_CHOSEN),
        "logps/rejected": mean(POLICY_REJECTED),
    }
    assert set(out.metrics) == set(want)
    for name, value in want.items():
        assert abs(out.metrics[name].item() - value) < 1e-9, name
    assert 0 < want["rewards/accuracies"] < 1  # the fixture has pairs on both sides


def test_dpo_default_is_trls_beta_and_no_smoothing():
    chosen, rejected = policy()
    explicit = dpo_loss(chosen, rejected, t(REFERENCE_CHOSEN), t(REFERENCE_REJECTED), global_pairs=6, beta=0.1)
    default = dpo_loss(chosen, rejected, t(REFERENCE_CHOSEN), t(REFERENCE_REJECTED), global_pairs=6)
    assert default.loss.item() == explicit.loss.item()
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(chosen, rejected, chosen, rejected, global_pairs=6, label_smoothing=0.5)


def test_ipo_equals_the_paper_with_length_averaged_log_ratios():
    tau = 0.1
    expected = []
    for pc, pr, rc, rr, lc, lr in zip(
        POLICY_CHOSEN, POLICY_REJECTED, REFERENCE_CHOSEN, REFERENCE_REJECTED, CHOSEN_LENGTHS, REJECTED_LENGTHS
    ):
        h = (pc - rc) / lc - (pr - rr) / lr
        expected.append((h - 1 / (2 * tau)) ** 2)
    chosen, rejected = policy()
    out = ipo_loss(
        chosen,
        rejected,
        t(REFERENCE_CHOSEN),
        t(REFERENCE_REJECTED),
        t(CHOSEN_LENGTHS),
        t(REJECTED_LENGTHS),
        global_pairs=PAIRS,
        beta=tau,
    )
    assert abs(out.loss.item() - mean(expected)) < 1e-6


@pytest.mark.parametrize("beta,gamma,ratio", [(0.1, None, None), (2.0, 1.0, None), (2.0, None, 0.5)])
def test_simpo_equals_the_paper(beta, gamma, ratio):
    margin = 0.5 if gamma is None and ratio is None else (gamma if gamma is not None else beta * ratio)
    expected = []
    for pc, pr, lc, lr in zip(POLICY_CHOSEN, POLICY_REJECTED, CHOSEN_LENGTHS, REJECTED_LENGTHS):
        expected.append(-log_sigmoid(beta / lc * pc - beta / lr * pr - margin))
    chosen, rejected = policy()
    out = simpo_loss(
        chosen,
        rejected,
        t(CHOSEN_LENGTHS),
        t(REJECTED_LENGTHS),
        global_pairs=PAIRS,
        beta=beta,
        gamma=gamma,
        gamma_beta_ratio=ratio,
    )
    assert abs(out.loss.item() - mean(expected)) < 1e-6
    assert (
        abs(out.metrics["rewards/chosen"].item() - mean([beta * c / n for c, n in zip(POLICY_CHOSEN, CHOSEN_LENGTHS)]))
        < 1e-9
    )
    with pytest.raises(ValueError, match="not both"):
        simpo_loss(
            chosen, rejected, t(CHOSEN_LENGTHS), t(REJECTED_LENGTHS), global_pairs=6, gamma=1.0, gamma_beta_ratio=1.0
        )


def test_orpo_equals_the_paper():
    """Eq. 6: the expectation over pairs of L_SFT + lambda L_OR, with L_SFT (eq. 2) the chosen
    completion's NLL averaged over its own tokens."""
    lam = 0.1
    nll = mean([-pc / lc for pc, lc in zip(POLICY_CHOSEN, CHOSEN_LENGTHS)])
    odds_terms = []
    for pc, pr, lc, lr in zip(POLICY_CHOSEN, POLICY_REJECTED, CHOSEN_LENGTHS, REJECTED_LENGTHS):
        p_w, p_l = math.exp(pc / lc), math.exp(pr / lr)
        log_odds_ratio = math.log((p_w / (1 - p_w)) / (p_l / (1 - p_l)))
        odds_terms.append(log_sigmoid(log_odds_ratio))
    expected = nll - lam * mean(odds_terms)
    chosen, rejected = policy()
    out = orpo_loss(chosen, rejected, t(CHOSEN_LENGTHS), t(REJECTED_LENGTHS), global_pairs=PAIRS, beta=lam)
    assert abs(out.loss.item() - expected) < 1e-6
    assert abs(out.metrics["nll_loss"].item() - nll) < 1e-9
    assert abs(out.metrics["log_odds_ratio"].item() - mean(odds_terms)) < 1e-9


def test_orpo_log_odds_stay_finite_near_probability_one():
    chosen = torch.tensor([-1e-9, -30.0], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([-50.0, -1e-3], dtype=torch.float64)
    out = orpo_loss(chosen, rejected, t([1, 1]), t([1, 1]), global_pairs=2)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(chosen.grad).all()


LABELS = [True, False, True, True, False, False, True]
KTO_POLICY = [-4.0, -6.5, -2.25, -9.0, -3.0, -7.5, -5.0]
KTO_REFERENCE = [-4.5, -6.0, -3.0, -8.5, -2.0, -8.0, -5.5]
# The mismatched (prompt, previous row's completion) pairs whose log-ratio estimates the KL.
KL_POLICY = [-8.0, -7.0, -9.5, -6.0, -10.0, -7.5, -8.25]
KL_REFERENCE = [-8.5, -7.25, -9.0, -6.75, -10.5, -7.0, -8.5]


@pytest.mark.parametrize("desirable_weight,undesirable_weight", [(1.0, 1.0), (1.33, 0.8)])
def test_kto_equals_the_paper(desirable_weight, undesirable_weight):
    beta = 0.1
    z = max(0.0, mean([p - r for p, r in zip(KL_POLICY, KL_REFERENCE)]))
    expected = []
    for label, p, r in zip(LABELS, KTO_POLICY, KTO_REFERENCE):
        reward = p - r
        if label:
            expected.append(desirable_weight * (1 - 1 / (1 + math.exp(-beta * (reward - z)))))
        else:
            expected.append(undesirable_weight * (1 - 1 / (1 + math.exp(-beta * (z - reward)))))
    kl = kto_kl(kto_kl_share(t(KL_POLICY), t(KL_REFERENCE), len(KL_POLICY)))
    assert abs(kl.item() - z) < 1e-12 and z > 0
    logps = t(KTO_POLICY, grad=True)
    out = kto_loss(
        logps,
        t(KTO_REFERENCE),
        torch.tensor(LABELS),
        kl,
        global_examples=7,
        global_desirable=4,
        global_undesirable=3,
        beta=beta,
        desirable_weight=desirable_weight,
        undesirable_weight=undesirable_weight,
    )
    assert abs(out.loss.item() - mean(expected)) < 1e-6
    chosen = [beta * (p - r) for label, p, r in zip(LABELS, KTO_POLICY, KTO_REFERENCE) if label]
    rejected = [beta * (p - r) for label, p, r in zip(LABELS, KTO_POLICY, KTO_REFERENCE) if not label]
    assert abs(out.metrics["rewards/chosen"].item() - mean(chosen)) < 1e-9
    assert abs(out.metrics["rewards/rejected"].item() - mean(rejected)) < 1e-9
    assert abs(out.metrics["rewards/margins"].item() - (mean(chosen) - mean(rejected))) < 1e-9
    assert abs(out.metrics["kl"].item() - z) < 1e-9


def test_kto_kl_is_clamped_at_zero_and_carries_no_gradient():
    policy_kl = t([-5.0, -6.0], grad=True)
    kl = kto_kl(kto_kl_share(policy_kl, t([-4.0, -5.0]), 2))
    assert kl.item() == 0.0 and not kl.requires_grad


def test_bradley_terry_equals_the_formula():
    chosen, rejected = [1.5, -0.25, 0.75, 2.0], [0.5, 0.5, 1.0, -1.0]
    margins = [0.1, 0.0, 0.3, 0.2]
    expected = mean([-log_sigmoid(c - r - m) for c, r, m in zip(chosen, rejected, margins)])
    expected += 0.01 * mean([(c + r) ** 2 for c, r in zip(chosen, rejected)])
    out = bradley_terry_loss(
        t(chosen, grad=True), t(rejected), global_pairs=4, margin=t(margins), center_rewards_coefficient=0.01
    )
    assert abs(out.loss.item() - expected) < 1e-6
    assert out.metrics["accuracy"].item() == 0.5
    assert abs(out.metrics["mean_reward"].item() - mean(chosen + rejected)) < 1e-12


# ---- split invariance: halves (and an uneven split) with the global count equal the whole batch ----


def pair_loss(kind, rows, count):
    chosen, rejected = policy()
    pick = lambda values: values[rows] if isinstance(values, torch.Tensor) else t(values)[rows]  # noqa: E731
    c, r = chosen[rows], rejected[rows]
    if kind == "dpo":
        out = dpo_loss(c, r, pick(REFERENCE_CHOSEN), pick(REFERENCE_REJECTED), global_pairs=count, label_smoothing=0.1)
    elif kind == "ipo":
        out = ipo_loss(
            c,
            r,
            pick(REFERENCE_CHOSEN),
            pick(REFERENCE_REJECTED),
            pick(CHOSEN_LENGTHS),
            pick(REJECTED_LENGTHS),
            global_pairs=count,
        )
    elif kind == "simpo":
        out = simpo_loss(c, r, pick(CHOSEN_LENGTHS), pick(REJECTED_LENGTHS), global_pairs=count)
    elif kind == "orpo":
        out = orpo_loss(
            c,
            r,
            pick(CHOSEN_LENGTHS),
            pick(REJECTED_LENGTHS),
            global_pairs=count,
        )
    else:
        out = bradley_terry_loss(c, r, global_pairs=count, center_rewards_coefficient=0.01)
    out.loss.backward()
    return out, chosen.grad, rejected.grad


@pytest.mark.parametrize("kind", ["dpo", "ipo", "simpo", "orpo", "reward-model"])
@pytest.mark.parametrize("split", [[3, 3], [2, 4], [1, 1, 4]])
def test_pair_losses_are_split_invariant(kind, split):
    whole, whole_chosen_grad, whole_rejected_grad = pair_loss(kind, slice(0, PAIRS), PAIRS)
    loss, metrics = 0.0, {}
    chosen_grad, rejected_grad = torch.zeros(PAIRS, dtype=torch.float64), torch.zeros(PAIRS, dtype=torch.float64)
    start = 0
    for size in split:
        part, c_grad, r_grad = pair_loss(kind, slice(start, start + size), PAIRS)
        loss += part.loss.item()
        for name, value in part.metrics.items():
            metrics[name] = metrics.get(name, 0.0) + value.item()
        chosen_grad += c_grad
        rejected_grad += r_grad
        start += size
    assert abs(loss - whole.loss.item()) < 1e-12
    for name, value in whole.metrics.items():
        assert abs(metrics[name] - value.item()) < 1e-12, name
    torch.testing.assert_close(chosen_grad, whole_chosen_grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(rejected_grad, whole_rejected_grad, atol=1e-12, rtol=0)


def test_kto_is_split_invariant():
    def run(rows):
        logps = t(KTO_POLICY, grad=True)
        kl = kto_kl(
            sum(kto_kl_share(t(KL_POLICY)[part], t(KL_REFERENCE)[part], 7) for part in (slice(0, 3), slice(3, 7)))
        )
        out = kto_loss(
            logps[rows],
            t(KTO_REFERENCE)[rows],
            torch.tensor(LABELS)[rows],
            kl,
            global_examples=7,
            global_desirable=4,
            global_undesirable=3,
            desirable_weight=1.2,
        )
        out.loss.backward()
        return out, logps.grad

    whole, whole_grad = run(slice(0, 7))
    first, first_grad = run(slice(0, 2))
    second, second_grad = run(slice(2, 7))
    assert abs(first.loss.item() + second.loss.item() - whole.loss.item()) < 1e-12
    torch.testing.assert_close(first_grad + second_grad, whole_grad, atol=1e-12, rtol=0)
    for name in whole.metrics:
        assert abs(first.metrics[name].item() + second.metrics[name].item() - whole.metrics[name].item()) < 1e-12


def test_a_global_count_must_be_positive():
    chosen, rejected = policy()
    with pytest.raises(ValueError, match="positive"):
        dpo_loss(chosen, rejected, chosen, rejected, global_pairs=0)
