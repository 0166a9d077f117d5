"""The declared parts of on-policy training: every built-in advantage estimator and policy loss passes
the check a user's part must pass (ditty.rl.check_*), a user's own is named by reference and checked by
the compiler, and REINFORCE++ equals its formula. examples/rl_parts.py reimplements two built-ins through
the public interface, and a run with them gives the built-in run's losses."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from ditty.cli import main
from ditty.objectives.rl.estimators import ESTIMATORS, estimator_for, reinforce_pp
from ditty.objectives.rl.policy_losses import POLICY_LOSSES
from ditty.rl import check_advantage_estimator, check_environment, check_policy_loss
from examples import rl_parts
from tests.rl.test_rl_recipe import check


class _Settings:
    group_size, scale_rewards = 4, "group"

    def __init__(self, advantage: str = "group", loss: str = "dapo") -> None:
        self.advantage, self.loss = advantage, loss


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_built_in_estimator_passes_the_estimator_check(name):
    check_advantage_estimator(estimator_for(_Settings(advantage=name)))


@pytest.mark.parametrize("name", POLICY_LOSSES)
@pytest.mark.parametrize("settings", [{}, {"beta": 0.04, "clip_high": 0.28}, {"importance": "sequence"}])
def test_every_built_in_policy_loss_passes_the_loss_check(name, settings):
    from ditty.objectives.rl.grpo import grpo_loss

    check_policy_loss(functools.partial(grpo_loss, loss=name), **settings)


def test_the_example_parts_pass_the_same_checks_and_equal_the_built_ins():
    check_advantage_estimator(rl_parts.group_advantages)
    check_policy_loss(rl_parts.dapo_loss)
    check_policy_loss(rl_parts.dapo_loss, beta=0.04, clip_high=0.28)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5], dtype=torch.float64)
    lengths = torch.ones_like(rewards)
    assert torch.equal(rl_parts.group_advantages(rewards, 4, lengths), estimator_for(_Settings())(rewards, 4, lengths))


def test_a_loss_that_divides_by_its_own_micro_batch_fails_the_check():
    """The mistake the check exists for: a mean over the micro-batch's own tokens."""
    from ditty.objectives.output import ObjectiveOutput

    def per_micro_batch(logps, old_logps, advantages, mask, **keywords):
        per_token = -logps * advantages[:, None] * mask
        return ObjectiveOutput(per_token.sum() / mask.sum())

    with pytest.raises(AssertionError, match="share of the global batch"):
        check_policy_loss(per_micro_batch)


def test_reinforce_pp_is_the_group_baseline_whitened_over_the_batchs_tokens():
    """verl's reinforce_plus_plus_baseline: scores less their group mean, tiled over each response's
    tokens, whitened with the masked mean and unbiased masked variance (rsqrt(var + 1e-8))."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    lengths = torch.tensor([3, 1, 4, 2, 2, 5, 1, 3], dtype=torch.float64)
    centred = [r - sum(rewards[g * 4 : g * 4 + 4].tolist()) / 4 for g in range(2) for r in rewards[g * 4 : g * 4 + 4]]
    tokens = [c for c, n in zip(centred, lengths.tolist()) for _ in range(int(n))]  # tiled over the response
    mean = sum(tokens) / len(tokens)
    variance = sum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1)
    expected = torch.tensor([(c - mean) / (variance + 1e-8) ** 0.5 for c in centred], dtype=torch.float64)
    torch.testing.assert_close(reinforce_pp(rewards, 4, lengths), expected, atol=1e-12, rtol=0)


def test_a_part_of_ones_own_is_checked_before_any_weight_loads(tmp_path, capsys):
    code, out = check(tmp_path, capsys, "--rl.advantage", "examples.rl_parts:group_advantages")
    assert code == 0 and "examples.rl_parts:group_advantages (your own estimator) advantages" in out, out
    for flags, words in (
        (["--rl.advantage", "grpo"], "'grpo' is neither a built-in advantage estimator"),
        (["--rl.advantage", "examples.rl_parts:no_such"], "no_such"),
        (["--rl.loss", "examples.rl_parts:group_advantages"], "cannot be called as fn(logps, old_logps"),
        (["--rl.advantage", "examples.rl_parts:dapo_loss"], "cannot be called as fn(rewards, group_size, lengths)"),
    ):
        code, out = check(tmp_path, capsys, *flags)
        assert code == 2 and words in out and "Traceback" not in out, out


def test_rloo_and_other_estimators_refuse_per_turn_credit(tmp_path, capsys):
    tools = ["--rl.tools", '["ditty.objectives.environments.tools.builtin_tools:calculator"]']
    tools += ["--rl.max_episode_tokens", "32"]
    code, out = check(tmp_path, capsys, *tools, "--rl.advantage", "rloo", "--rl.credit", "turn")
    assert code == 2 and "`rl.credit`" in out and "do not compose" in out, out
    assert check(tmp_path, capsys, *tools, "--rl.credit", "turn")[0] == 0


def test_a_runs_own_parts_are_code_a_reader_does_not_import_untrusted():
    from dataclasses import replace

    from ditty.config import TrainerConfig
    from ditty.config.references import code_references
    from ditty.config.rl import RLConfig

    config = replace(TrainerConfig(), rl=RLConfig(kind="grpo", advantage="mine:estimate", loss="mine:loss"))
    assert code_references(config) == ["rl.advantage = 'mine:estimate'", "rl.loss = 'mine:loss'"]
    assert code_references(replace(config, rl=RLConfig(kind="grpo", advantage="rloo"))) == []


@pytest.mark.slow
def test_reinforce_pp_trains_tiny_grpo(tmp_path, tiny_llama_dir):
    out = tmp_path / "run"
    flags = ["--model.path", tiny_llama_dir, "--run.output_dir", str(out), "--train.steps", "3"]
    flags += ["--scheduler.warmup_steps", "1", "--train.eval_samples", "0", "--logging.progress", "false"]
    flags += ["--train.log_every", "1"]
    flags += ["--rl.rewards", '["tests.rl.rewards_for_tests:text_hash_reward"]', "--rl.advantage", "reinforce_pp"]
    assert main(["run", "tiny_grpo", *flags]) == 0
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r] == [1, 2, 3]
    assert "reinforce_pp advantages" in (out / "final" / "README.md").read_text()


def test_the_checks_catch_an_environment_that_answers_wrongly():
    from ditty.rl import StepResult

    class Answers:
        def reset(self, row):
            return row["prompt"]

        def step(self, completion):
            return StepResult(reward=1.0, done="yes")

    class Fine(Answers):
        def step(self, completion):
            return StepResult(reward=1.0, done=True)

    check_environment(Fine, [{"prompt": "1+1="}], ["2"])
    with pytest.raises(AssertionError, match="done = 'yes', not True or False"):
        check_environment(Answers, [{"prompt": "1+1="}], ["2"])


@pytest.mark.slow
def test_a_trainer_subclass_swaps_the_environment_part(tmp_path):
    """docs/ARCHITECTURE.md's swap: override build_objective, call build_rl and replace
    parts.stream.environment. The replacement wraps the built one and halves every reward: the run
    trains on its rewards, not the built one's."""
    from ditty.objectives.rl.row import build_rl
    from ditty.train import Trainer
    from tests.rl.helpers import grpo_config

    calls = []

    class HalvedRewards:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):  # held_out, score_drawn: the built environment's
            return getattr(self.inner, name)

        def run(self, sampler, prompt_batch, first_position, group):
            rollouts = self.inner.run(sampler, prompt_batch, first_position, group)
            calls.append(rollouts.rewards.clone())
            rollouts.rewards = rollouts.rewards / 2
            return rollouts

    class Swapped(Trainer):
        def build_objective(self):
            parts = build_rl(self)
            parts.stream.environment = HalvedRewards(parts.stream.environment)
            return parts

    hashed = ["tests.rl.rewards_for_tests:text_hash_reward"]  # rewards of a random model that differ
    Swapped(grpo_config(tmp_path, train=dict(steps=2, log_every=1), rewards=hashed)).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [r["reward"] for r in rows if "loss" in r]
    assert len(calls) == 2 and len(logged) == 2 and all(float(c.abs().sum()) > 0 for c in calls)
    for before, reward in zip(calls, logged):
        assert reward == pytest.approx(float(before.mean()) / 2, abs=1e-6)
