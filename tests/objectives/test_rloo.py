"""The RLOO row (`rl.advantage = "rloo"`): the leave-one-out advantages against their formula, term by
term, and a run of the row through the trainer (its parts are GRPO's but the advantage estimator)."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from ditty.objectives.rl.estimators import estimator_for, rloo
from ditty.objectives.rl.rloo import leave_one_out_advantages
from tests.rl.helpers import grpo_config

REWARDS = [1.0, 0.0, 0.5, 0.0, 2.0, 2.0, 2.0, 2.0, 0.0, 3.0, 1.0, 1.0]
GROUP = 4


def formula(rewards, group):
    """A_i = r_i - mean of the other completions of its prompt (Ahmadian et al. 2024, eq. 8)."""
    out = []
    for start in range(0, len(rewards), group):
        members = rewards[start : start + group]
        for i, r in enumerate(members):
            others = members[:i] + members[i + 1 :]
            out.append(r - sum(others) / len(others))
    return out


def test_leave_one_out_advantages_equal_the_formula():
    got = leave_one_out_advantages(torch.tensor(REWARDS, dtype=torch.float64), GROUP).advantages
    assert got.tolist() == pytest.approx(formula(REWARDS, GROUP), abs=1e-12)
    assert got[4:8].tolist() == [0.0, 0.0, 0.0, 0.0]  # a group that scored alike teaches nothing
    # the leave-one-out baseline is the group mean's, scaled by G / (G - 1)
    group = REWARDS[:4]
    assert float(got[0]) == pytest.approx(GROUP / (GROUP - 1) * (group[0] - statistics.fmean(group)))


def test_scaled_leave_one_out_advantages():
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    plain = torch.tensor(formula(REWARDS, GROUP), dtype=torch.float64)
    by_group = leave_one_out_advantages(rewards, GROUP, "group").advantages
    stds = rewards.reshape(-1, GROUP).std(dim=1).repeat_interleave(GROUP)
    torch.testing.assert_close(by_group, plain / (stds + 1e-4), atol=1e-12, rtol=0)
    by_batch = leave_one_out_advantages(rewards, GROUP, "batch").advantages  # TRL's normalize_advantages
    torch.testing.assert_close(by_batch, (plain - plain.mean()) / (plain.std() + 1e-4), atol=1e-12, rtol=0)


def test_the_estimator_reports_the_rewards_like_grpos():
    out = leave_one_out_advantages(torch.tensor(REWARDS), GROUP)
    assert out.metrics["reward"].item() == pytest.approx(statistics.fmean(REWARDS))
    assert out.metrics["frac_reward_zero_std"].item() == pytest.approx(1 / 3)
    estimate = estimator_for(type("RL", (), {"advantage": "rloo", "group_size": GROUP, "scale_rewards": "none"})())
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    expected = leave_one_out_advantages(rewards, GROUP).advantages
    assert torch.equal(estimate(rewards, GROUP, torch.ones_like(rewards)), expected)


def test_the_rloo_row_trains_and_logs_its_rewards(tmp_path):
    from ditty.train import Trainer

    config = grpo_config(
        tmp_path, train=dict(steps=2), advantage="rloo", scale_rewards="none",
        rewards=["tests.rl.rewards_for_tests:text_hash_reward"],
    )  # fmt: skip
    trainer = Trainer(config)
    assert trainer.stream.advantage.func is rloo
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(0 < r["reward"] < 1 and r["reward_std"] > 0 for r in steps)
    assert any(r["loss"] != 0 for r in steps)
    card = (tmp_path / "run" / "final" / "README.md").read_text()
    assert "rloo advantages" in card
