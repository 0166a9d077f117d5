"""`rl.rewards` takes a reward model's directory beside functions (TRL's reward_funcs take a model):
its one score of each completion after its prompt is the reward, weighted like a function's; a
directory that is not a one-score model is exit 2 before training."""

from __future__ import annotations

import json

import pytest
import torch

from ditty.cli import main
from ditty.objectives.rewards.scorer import RewardModelScorer
from tests.rl.test_rl_recipe import RECIPE


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from ditty.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = AutoConfig.for_model(
        "llama", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("reward-model")
    AutoModelForSequenceClassification.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_the_scorer_reads_each_completion_after_its_prompt_as_its_card_does(reward_model_dir):
    scorer = RewardModelScorer(reward_model_dir, batch_size=2)
    scores = scorer(["3+4=", "3+4=", "10+1="], ["7", "8", "11"])
    assert len(scores) == 3 and len(set(scores)) == 3
    alone = RewardModelScorer(reward_model_dir)(["10+1="], ["11"])  # padding in a batch changes nothing
    assert alone[0] == pytest.approx(scores[2], abs=1e-5)


def test_grpo_trains_on_a_reward_models_scores(tmp_path, capsys, reward_model_dir):
    path = tmp_path / "grpo.toml"
    path.write_text(RECIPE.replace('"ditty.objectives.rewards.builtin_rewards:exact_match"', f'"{reward_model_dir}"'))
    code = main(["run", str(path), "--run.output_dir", str(tmp_path / "run"), "--logging.progress", "false"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert steps and all(f"rewards/{reward_model_dir}/mean" in r and r["reward_std"] > 0 for r in steps)


def test_a_directory_that_is_not_a_reward_model_is_exit_2(tmp_path, capsys, tiny_llama_dir):
    path = tmp_path / "grpo.toml"
    path.write_text(RECIPE.replace('"ditty.objectives.rewards.builtin_rewards:exact_match"', f'"{tiny_llama_dir}"'))
    assert main(["check", str(path)]) == 2
    out = capsys.readouterr()
    assert "`rl.rewards[0]`" in out.err + out.out and "one" in out.err + out.out
