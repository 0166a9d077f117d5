"""The reward model's loss stage (ditty.objectives.reward_stage) on fixed scores: the Bradley-Terry
formula computed independently with plain torch, TRL's metric names, filler pairs, per-token scores,
and the pair accuracy validation reports."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ditty._utils.labels import IGNORE_INDEX
from ditty.objectives.reward_stage import BradleyTerryLoss, PairAccuracy, pair_scores

CHOSEN = [1.5, -0.25, 0.75, 2.0]
REJECTED = [0.5, 0.5, -1.0, 2.5]


def pair_batch(pairs: int, width: int = 5, filler: int = 0) -> dict:
    """2N right-padded rows (chosen, then rejected); the last `filler` pairs score nothing."""
    labels = torch.full((2 * pairs, width), 7)
    labels[:, 0] = IGNORE_INDEX
    for index in range(pairs - filler, pairs):
        labels[index] = IGNORE_INDEX
        labels[pairs + index] = IGNORE_INDEX
    mask = torch.ones(2 * pairs, width, dtype=torch.long)
    mask[:, -1] = 0  # one pad column
    return {"input_ids": torch.zeros_like(labels), "labels": labels, "attention_mask": mask}


def test_the_loss_is_the_bradley_terry_sum_with_the_pair_count():
    leaf = torch.tensor(CHOSEN + REJECTED, dtype=torch.float64, requires_grad=True)
    out = BradleyTerryLoss()({"logits": leaf[:, None]}, {"batch": pair_batch(4)})
    chosen, rejected = torch.tensor(CHOSEN), torch.tensor(REJECTED)
    expected = -F.logsigmoid(chosen - rejected).sum()
    assert out.num_tokens == 4
    assert abs(out.loss.item() - expected.item()) < 1e-6
    metrics = {k: float(v) for k, v in out.metrics.items()}
    assert metrics["rewards/chosen"] == pytest.approx(sum(CHOSEN) / 4)
    assert metrics["rewards/rejected"] == pytest.approx(sum(REJECTED) / 4)
    assert metrics["rewards/margins"] == pytest.approx((sum(CHOSEN) - sum(REJECTED)) / 4)
    assert metrics["rewards/accuracies"] == pytest.approx(2 / 4)
    out.loss.backward()  # the gradient reaches every score: d/dr_c = -sigmoid(r_r - r_c)
    grad = leaf.grad
    assert torch.allclose(grad[:4], -torch.sigmoid(rejected - chosen).double(), atol=1e-12)
    assert torch.allclose(grad[4:], torch.sigmoid(rejected - chosen).double(), atol=1e-12)


def test_the_center_rewards_term_adds_its_mean_square():
    scores = torch.tensor(CHOSEN + REJECTED)[:, None]
    plain = BradleyTerryLoss()({"logits": scores}, {"batch": pair_batch(4)}).loss
    centred = BradleyTerryLoss(center_rewards_coefficient=0.01)({"logits": scores}, {"batch": pair_batch(4)}).loss
    square = sum((c + r) ** 2 for c, r in zip(CHOSEN, REJECTED))
    assert centred.item() == pytest.approx(plain.item() + 0.01 * square)


def test_a_filler_pair_counts_nothing():
    scores = torch.tensor(CHOSEN + REJECTED)[:, None]
    out = BradleyTerryLoss()({"logits": scores}, {"batch": pair_batch(4, filler=1)})
    expected = -F.logsigmoid(torch.tensor(CHOSEN[:3]) - torch.tensor(REJECTED[:3])).sum()
    assert out.num_tokens == 3 and out.loss.item() == pytest.approx(expected.item())
    accuracy = PairAccuracy()
    accuracy.add(scores, pair_batch(4, filler=1))
    assert accuracy.result() == pytest.approx(2 / 3)


def test_scores_per_token_are_read_at_the_last_attended_token():
    per_token = torch.randn(8, 5, 1)
    per_token[:, 3, 0] = torch.tensor(CHOSEN + REJECTED)  # column 4 is padding
    chosen, rejected, real = pair_scores(per_token, pair_batch(4))
    assert chosen.tolist() == pytest.approx(CHOSEN) and rejected.tolist() == pytest.approx(REJECTED)
    assert real.all()


def test_a_head_of_several_labels_is_refused():
    with pytest.raises(ValueError, match="one score per text"):
        pair_scores(torch.zeros(8, 3, 2), pair_batch(4))
