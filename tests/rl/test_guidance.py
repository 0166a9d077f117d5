"""Off-policy guidance (`rl.guidance_column`, ditty.objectives.rl.guidance): a group that sampled nothing
as good as the data's answer trains on that answer in place of its last completion."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ditty.cli import main
from ditty.config.errors import RecipeError
from ditty.objectives.rewards.functions import load_reward_functions
from ditty.objectives.rl.guidance import Guidance
from ditty.objectives.sampling.batch import RolloutBatch
from tests.rl.test_rl_recipe import RECIPE, check

EXACT_MATCH = "ditty.objectives.rewards.builtin_rewards:exact_match"


@pytest.fixture(scope="module")
def tokenizer():
    from ditty.data.tokenizer import byte_tokenizer

    return byte_tokenizer()


def scored_rollouts(functions, prompt_batch, texts, tokenizer, *, sampler_logps=False) -> RolloutBatch:
    group = len(texts) // len(prompt_batch["prompts"])
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    rollouts = RolloutBatch(
        prompt_ids=[[1]] * len(texts),
        completion_ids=ids,
        texts=list(texts),
        truncated=[False] * len(texts),
        sampler_logps=[[-0.5] * len(i) for i in ids] if sampler_logps else None,
    )
    from ditty.objectives.environments.protocol import RewardEnvironment

    RewardEnvironment(functions).score_drawn(rollouts, prompt_batch, group)
    return rollouts


def test_a_group_with_no_right_answer_gets_the_datas_in_place_of_its_last(tokenizer):
    functions = load_reward_functions([EXACT_MATCH])
    prompt_batch = {"prompts": ["1+2=", "3+4=", "50+50="], "columns": {"completion": ["3", "7", "100"]}}
    texts = ["4", "5", "6", "7", "9", "7", "1", "2", "3"]  # 3 prompts x 3 completions
    rollouts = scored_rollouts(functions, prompt_batch, texts, tokenizer, sampler_logps=True)
    Guidance("completion", functions, tokenizer, max_new_tokens=4).apply(rollouts, prompt_batch, 3)

    assert rollouts.guided == [False, False, True, False, False, False, False, False, True]
    assert rollouts.texts[2] == "3" and rollouts.texts[8] == "100"
    eos = tokenizer.eos_token_id
    assert rollouts.completion_ids[2] == tokenizer("3", add_special_tokens=False)["input_ids"] + [eos]
    assert rollouts.rewards.tolist() == [0, 0, 1, 1, 0, 1, 0, 0, 1]
    assert rollouts.rewards_per_function[functions[0].name].tolist() == rollouts.rewards.tolist()
    assert all(math.isnan(v) for v in rollouts.sampler_logps[2])  # no sampler drew it
    assert rollouts.sampler_logps[1] == [-0.5]
    assert rollouts.texts[3:6] == ["7", "9", "7"]  # a group that sampled the answer is left as it was

    # An answer longer than the sampling budget is not put in; a missing column is exit 2 naming the key.
    rollouts = scored_rollouts(functions, prompt_batch, texts, tokenizer)
    Guidance("completion", functions, tokenizer, max_new_tokens=3).apply(rollouts, prompt_batch, 3)
    assert rollouts.guided == [False, False, True, False, False, False, False, False, False]
    with pytest.raises(RecipeError, match="no column 'answer'") as raised:
        Guidance("answer", functions, tokenizer, max_new_tokens=4).apply(rollouts, prompt_batch, 3)
    assert "`rl.guidance_column`" in str(raised.value)


def test_a_run_with_guidance_trains_on_the_answers_and_logs_what_it_sampled(tmp_path):
    """A random policy samples no right sum: every group gets its answer, and the step logs the share
    guided and the reward of what the policy sampled beside the reward of the batch it trained on."""
    path = tmp_path / "grpo.toml"
    run = f'[run]\noutput_dir = "{tmp_path / "run"}"\nnum_threads = 1\n[logging]\nprogress = false\n'
    path.write_text(RECIPE + run)
    train = ["--train.log_every", "1", "--train.eval_every", "0", "--rl.guidance_column", "completion"]
    assert main(["run", str(path), *train]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["rollout/guided_share"] == 1.0 and row["rollout/sampled_reward"] == 0.0
        assert row["reward"] == pytest.approx(1 / 4)  # one answer in each group of 4
        assert row["frac_reward_zero_std"] == 0.0


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--rl.guidance_column", "answer"], "the built-in dataset's prompt rows have no column 'answer'"),
        (
            ["--rl.guidance_column", "completion", "--rl.tools", '["tests.rl.environments_for_tests:echo"]'],
            "these rollouts are episodes",
        ),
    ],
)
def test_guidance_that_cannot_apply_is_exit_2(tmp_path, capsys, flags, words):
    code, out = check(tmp_path, capsys, *flags)
    assert code == 2 and "`rl.guidance_column`" in out and words in out, out
    code, out = check(tmp_path, capsys, "--rl.guidance_column", "completion")
    assert code == 0, out


def test_guidance_off_leaves_every_row_sampled(tokenizer):
    functions = load_reward_functions([EXACT_MATCH])
    prompt_batch = {"prompts": ["1+2="], "columns": {"completion": ["3"]}}
    rollouts = scored_rollouts(functions, prompt_batch, ["4", "5"], tokenizer)
    assert rollouts.guided is None and torch.equal(rollouts.rewards, torch.zeros(2, dtype=torch.float64))


def test_negative_advantages_are_scaled_by_rl_negative_advantage_scale():
    """0 keeps only the completions above their group's mean (their advantages as the estimator gave
    them); 0.5 halves the others'; 1 leaves GRPO's advantages as they are."""
    from types import SimpleNamespace

    from ditty.config.rl import RLConfig
    from ditty.objectives.rl.estimators import estimator_for
    from ditty.objectives.rl.stream import RolloutStream

    def advantages(scale: float) -> torch.Tensor:
        rl = RLConfig(kind="grpo", group_size=4, negative_advantage_scale=scale)
        stream = RolloutStream(
            None,
            sampling=SimpleNamespace(max_staleness=0),
            environment=None,
            advantage=estimator_for(rl),
            assembler=None,
            rl=rl,
            rank=0,
            world_size=1,
        )
        rollouts = RolloutBatch(
            prompt_ids=[[1]] * 4, completion_ids=[[5, 2]] * 4, texts=[""] * 4, truncated=[False] * 4
        )
        rollouts.rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        stream.estimate(rollouts)
        return rollouts.advantages

    grpo = advantages(1.0)
    assert grpo[0] > 0 and (grpo[1:] < 0).all()
    assert torch.equal(advantages(0.0), torch.cat([grpo[:1], torch.zeros(3, dtype=grpo.dtype)]))
    assert torch.allclose(advantages(0.5), torch.cat([grpo[:1], grpo[1:] / 2]))
