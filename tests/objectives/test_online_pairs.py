"""The online-pairs row (`[preference] pairs = "online"`): pairs are the best and the worst of each group
the live policy samples, judged by the reward functions (ties dropped), and train the preference loss;
from prompt rows or from the prompts of preference pairs (their chosen answer judges)."""

from __future__ import annotations

import json

import pytest
import torch

from ditty.cli import main
from ditty.objectives.online_pairs import OnlinePairStream, PromptsOfPairs
from ditty.objectives.sampling.batch import RolloutBatch


def recipe(tmp_path, model_dir, data_format="preference", extra=""):
    path = tmp_path / "online.toml"
    path.write_text(
        f"""
[run]
output_dir = "{tmp_path / "run"}"
device = "cpu"
seed = 0
[model]
path = "{model_dir}"
[data]
source = "builtin"
name = "addition"
format = "{data_format}"
max_seq_len = 32
num_samples = 300
[train]
steps = 3
global_batch_size = 8
micro_batch_size = 4
log_every = 1
eval_samples = 16
precision = "fp32"
[peft]
kind = "lora"
r = 4
alpha = 8
[preference]
kind = "dpo"
pairs = "online"
[rl]
group_size = 4
{extra}
[rollout]
max_new_tokens = 4
[logging]
progress = false
"""
    )
    return path


class FixedSampler:
    """Completions given by hand, four per prompt, for the pairing rule."""

    def __init__(self, completions, cut=False):
        self.completions, self.cut = completions, cut  # cut: every sample reached the budget

    def sample(self, prompt_ids, first, max_new_tokens=None):
        self.cap = max_new_tokens
        rows = [(p, c) for p in prompt_ids for c in self.completions[:4]]
        texts = [str(c) for _, c in rows]
        return RolloutBatch([p for p, _ in rows], [c for _, c in rows], texts, [self.cut] * len(rows))


class LengthRewards:
    def score(self, rollouts, prompts, columns):
        rollouts.rewards = torch.tensor([float(len(c)) for c in rollouts.completion_ids], dtype=torch.float64)


class OnePromptBatch:
    def __init__(self, prompts, answers=None):
        self.prompts, self.answers, self.cursor = prompts, answers, 0

    def next_step(self):
        self.cursor += len(self.prompts)
        batch = {"prompt_ids": self.prompts, "prompts": ["p"] * len(self.prompts), "columns": {}}
        if self.answers:  # preference data: each prompt's chosen completion (PromptsOfPairs)
            batch["answer_ids"] = self.answers
            batch["columns"] = {"answer": [str(a) for a in self.answers]}
        return [batch]


class AnswerRewards:
    """1 for the reference answer's text, 0 for anything else (exact match against `answer`)."""

    def score(self, rollouts, prompts, columns):
        rollouts.rewards = torch.tensor([float(t == a) for t, a in zip(rollouts.texts, columns["answer"])])


def stream_over(completions, answers=None, environment=None, cut=False, budgets=None) -> OnlinePairStream:
    """Two prompts, each answered by the same four `completions`, scored by their length."""
    from ditty.data.formats.preference_rows import PairCollator

    return OnlinePairStream(
        OnePromptBatch([[1, 2], [3]], answers),
        sampler=FixedSampler(completions, cut),
        environment=environment or LengthRewards(),
        collator=PairCollator(0),
        group_size=4,
        refresh_every=1,
        micro_batches_per_step=1,
        micro_batch_size=2,
        max_seq_len=32,
        rank=0,
        world_size=1,
        budgets=budgets,
    )


def test_the_best_and_the_worst_of_a_group_become_a_pair_and_ties_are_dropped():
    stream = stream_over([[5, 6, 7], [5], [5, 6], [9]])  # lengths 3, 1, 2, 1: best the first, worst the second
    (batch,) = stream.next_step()
    # two prompts, two pairs: chosen rows first, then rejected (ditty.data.formats.preference_rows)
    assert batch["input_ids"][0, :5].tolist() == [1, 2, 5, 6, 7] and batch["input_ids"][2, :3].tolist() == [1, 2, 5]
    assert stream.step_metrics()["online/pairs"] == 1.0 and stream.step_metrics()["online/tied_groups"] == 0.0


def test_a_refresh_without_pairs_says_its_steps_train_nothing(caplog):
    tied = stream_over([[5], [6], [7], [8]])  # all alike: no preference, no pair
    with caplog.at_level("WARNING", logger="ditty.objectives.online_pairs"):
        (batch,) = tied.next_step()
        tied.refresh()  # again: said once a run
    assert bool((batch["labels"] == -100).all())  # filler pairs only: they score nothing
    assert tied.step_metrics()["online/tied_groups"] == 1.0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "the samples of 2 of 2 prompts all scored alike" in said[0], said
    assert "the next step trains nothing" in said[0] and "rollout.temperature" in said[0]

    with caplog.at_level("WARNING", logger="ditty.objectives.online_pairs"):
        caplog.clear()
        stream_over([[5, 6, 7], [5], [5, 6], [9]]).next_step()
    assert not caplog.records  # pairs made: nothing to say


def test_a_pairs_chosen_answer_joins_its_group_so_a_prompt_never_answered_right_still_pairs():
    stream = stream_over([[5], [6], [7], [8]], answers=[[9, 2], [4, 2]], environment=AnswerRewards())
    (batch,) = stream.next_step()
    # every sample wrong: the chosen answer (the extra candidate) against the first, worst sample
    assert batch["input_ids"][0, :4].tolist() == [1, 2, 9, 2] and batch["input_ids"][2, :3].tolist() == [1, 2, 5]
    assert stream.sampler.cap == 3  # one token past the longest chosen answer


def test_the_prompts_of_pairs_keep_their_chosen_answer_for_the_rewards():
    from ditty.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    prompt = tokenizer("12+3=")["input_ids"]
    answer = tokenizer("15", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    sample = {"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer}
    batch = PromptsOfPairs(tokenizer)([sample])
    assert batch["prompt_ids"] == [prompt] and batch["columns"] == {"answer": ["15"]}
    assert batch["answer_ids"] == [answer]


@pytest.mark.parametrize("data_format", ["preference", "prompt"])
def test_online_pairs_train_from_prompts_or_pairs(tmp_path, tiny_llama_dir, capsys, data_format):
    # random completions of a random model: their hashes differ, so every group makes a pair
    extra = 'rewards = ["tests.rl.rewards_for_tests:text_hash_reward"]'
    assert main(["run", str(recipe(tmp_path, tiny_llama_dir, data_format, extra))]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 3
    assert all("online/pairs" in r and "rewards/margins" in r for r in steps)
    assert steps[0]["online/pairs"] == 1.0 and all(r["loss"] > 0 for r in steps)
    if data_format == "prompt":  # the held-out reward, as RL's
        assert "val_reward" in records[-1]
    else:
        assert "val_exact_match" in records[-1] and "val_rewards/accuracies" in records[-1]
    assert "pairs sampled online" in (tmp_path / "run" / "final" / "README.md").read_text()


@pytest.mark.parametrize(
    "flags, key, words",
    [
        (["--preference.kind", "kto"], "preference.kind", "unpaired"),
        (["--preference.reference", "precompute"], "preference.reference", "sampled during"),
        (["--data.format", "prompt"], "rl.rewards", "needs reward functions"),
        (["--rl.group_size", "1"], "rl.group_size", "at least 2"),
        (["--rollout.temperature", "-1"], "rollout.temperature", "above 0"),
        (["--rollout.max_new_tokens", "0"], "rollout.max_new_tokens", "at least 1"),
        (["--rollout.top_p", "0"], "rollout.top_p", "in (0, 1]"),
        (["--rollout.max_staleness", "1"], "rollout.max_staleness", 'rollout.backend = "generate" samples from'),
        (["--rl.reward_weights", "[1.0, 2.0]"], "rl.reward_weights", "judged by one function"),
    ],
)
def test_bad_online_settings_are_exit_2(tmp_path, tiny_llama_dir, capsys, flags, key, words):
    code = main(["check", str(recipe(tmp_path, tiny_llama_dir)), *flags])
    out = capsys.readouterr()
    text = out.err + out.out
    assert code == 2 and f"`{key}`" in text and words in text, text


def test_rl_keys_online_pairs_do_not_read_are_named_in_a_warning(tmp_path, tiny_llama_dir, capsys):
    flags = ["--rl.loss", "grpo", "--rl.mask_truncated", "true", "--rl.beta", "0.1"]
    code = main(["check", str(recipe(tmp_path, tiny_llama_dir)), *flags])
    text = "".join(capsys.readouterr())
    assert code == 0, text
    warning = next(line for line in text.splitlines() if line.startswith("warning:") and "`rl.beta`" in line)
    assert "has no effect" in warning and "rl.loss, rl.mask_truncated" in warning, warning


def test_a_calls_cap_only_shortens_the_completions_rollout_max_new_tokens_allows(tiny_llama_dir):
    """Online pairs pass one token past the longest chosen answer as a cap: `rollout.max_new_tokens` still
    bounds every completion when that cap is longer, and the shorter of the two applies."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ditty.config.rollout import RolloutConfig
    from ditty.objectives.sampling.generate_sampler import GenerateSampler

    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(tiny_llama_dir),
        AutoTokenizer.from_pretrained(tiny_llama_dir),
    )
    sampler = GenerateSampler(lambda: model, RolloutConfig(max_new_tokens=3), 4, tokenizer, torch.device("cpu"), seed=0)
    prompts = [tokenizer("12+3=")["input_ids"], tokenizer("7+8=")["input_ids"]]
    longest = lambda cap: max(len(ids) for ids in sampler.sample(prompts, 0, cap).completion_ids)  # noqa: E731
    assert longest(None) == 3 and longest(50) == 3 and longest(2) == 2


def test_samples_cut_at_the_budget_warn_once_but_not_those_cut_at_a_reference_answer(caplog):
    """Prompts without references: most samples at rollout.max_new_tokens in the first three refreshes
    is said once, naming the key, as GRPO says it. Preference prompts cut their samples at the chosen
    answer's length on purpose (a longer one is wrong): nothing to say."""
    from ditty.config.rl import RLConfig
    from ditty.config.rollout import RolloutConfig
    from ditty.objectives.rl.budgets import BudgetWatch

    def warned(stream) -> list:
        caplog.clear()
        with caplog.at_level("WARNING", logger="ditty.objectives.online_pairs"):
            for _ in range(4):
                stream.refresh()
        return [r.getMessage() for r in caplog.records if "were cut" in r.getMessage()]

    def watch():
        return BudgetWatch(RLConfig(kind="grpo"), RolloutConfig(max_new_tokens=3))

    said = warned(stream_over([[5, 6, 7], [5], [5, 6], [9]], cut=True, budgets=watch()))
    assert len(said) == 1 and "100% of the samples of the first 3 rollouts" in said[0], said
    assert "rollout.max_new_tokens = 3" in said[0]
    assert stream_over([[5]] * 4, cut=True).refresh()[1]["completions/clipped_ratio"] == 1.0
    assert warned(stream_over([[5, 6, 7], [5], [5, 6], [9]], budgets=watch())) == []
    assert warned(stream_over([[5, 6, 7], [5], [5, 6], [9]], answers=[[5], [6]], cut=True, budgets=watch())) == []
