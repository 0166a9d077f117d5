"""Built-in datasets: deterministic, held-out problems disjoint from training, a weak trivial
baseline, and an exact-match metric that scores a perfect and a wrong generator correctly."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from ditty.config.errors import RecipeError
from ditty.config.sections import DataConfig
from ditty.data.build import build_data
from ditty.data.task import exact_match
from ditty.data.tokenizer import byte_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module", params=["addition", "reverse"])
def bundle(request, tokenizer):
    return build_data(DataConfig(name=request.param, num_samples=4000, val_fraction=0.1), tokenizer, seed=0)


def _prompts(dataset, tokenizer) -> set[str]:
    """The prompt text of every tokenized sample (the tokens before the first supervised one)."""
    prompts = set()
    for ids, labels in zip(dataset["input_ids"], dataset["labels"]):
        first_supervised = next(i for i, label in enumerate(labels) if label != -100)
        prompts.add(tokenizer.decode(ids[:first_supervised], skip_special_tokens=True))
    return prompts


def test_builtin_data_is_deterministic(bundle, tokenizer):
    again = build_data(DataConfig(name=bundle.task.name, num_samples=4000, val_fraction=0.1), tokenizer, seed=123)
    assert again.train["input_ids"] == bundle.train["input_ids"]
    assert again.val["labels"] == bundle.val["labels"]
    assert again.task == bundle.task


def test_held_out_problems_never_appear_in_training(bundle, tokenizer):
    train_prompts = _prompts(bundle.train, tokenizer)
    val_prompts = _prompts(bundle.val, tokenizer)
    assert set(bundle.task.prompts) == val_prompts
    assert len(val_prompts) == len(bundle.task.prompts) > 100  # distinct, and enough to measure
    assert not train_prompts & val_prompts


def test_most_frequent_answer_baseline_is_at_most_five_percent(bundle):
    most_common_count = Counter(bundle.task.answers).most_common(1)[0][1]
    assert most_common_count / len(bundle.task.answers) <= 0.05


def test_answers_have_several_tokens(bundle, tokenizer):
    lengths = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in bundle.task.answers]
    assert sum(lengths) / len(lengths) >= 2
    assert bundle.task.max_new_tokens == max(lengths) + 1


class OracleLM(torch.nn.Module):
    """A fake causal LM that 'generates' `answer_of(prompt)` then eos, reading its own input.

    Prompts end with "="; whatever follows is what it has generated so far.
    """

    def __init__(self, tokenizer, answer_of):
        super().__init__()
        self.tokenizer, self.answer_of, self.forwards = tokenizer, answer_of, 0

    def forward(self, input_ids, attention_mask, position_ids, use_cache):
        assert not self.training and not torch.is_grad_enabled()
        self.forwards += 1
        equals = self.tokenizer.convert_tokens_to_ids("=")
        logits = torch.zeros(*input_ids.shape, len(self.tokenizer))
        for row, (ids, mask) in enumerate(zip(input_ids.tolist(), attention_mask.tolist())):
            ids = [token for token, keep in zip(ids, mask) if keep]
            prompt_end = ids.index(equals) + 1
            prompt = self.tokenizer.decode(ids[:prompt_end], skip_special_tokens=True)
            target = self.tokenizer(self.answer_of(prompt), add_special_tokens=False)["input_ids"]
            target.append(self.tokenizer.eos_token_id)
            generated = len(ids) - prompt_end
            logits[row, -1, target[min(generated, len(target) - 1)]] = 1.0
        return type("Output", (), {"logits": logits})()


def _add(prompt: str) -> str:
    left, right = prompt.rstrip("=").split("+")
    return str(int(left) + int(right))


def test_exact_match_of_a_perfect_and_a_wrong_generator(tokenizer):
    task = build_data(DataConfig(num_samples=4000, val_fraction=0.1), tokenizer, seed=0).task
    perfect = OracleLM(tokenizer, _add).train()
    assert task.evaluate(perfect, tokenizer, "cpu", max_samples=70) == {"exact_match": 1.0}
    assert perfect.training  # evaluation restores the mode it found
    # Same number of forwards for every batch whatever the answers: ceil(70 / 64) batches.
    assert perfect.forwards == 2 * task.max_new_tokens

    off_by_one = OracleLM(tokenizer, lambda prompt: str(int(_add(prompt)) + 1))
    assert task.evaluate(off_by_one, tokenizer, "cpu", max_samples=70) == {"exact_match": 0.0}


def test_exact_match_counts_hits():
    assert exact_match(["59", " 3 ", "x"], ["59", "3", "4"]) == pytest.approx(2 / 3)


def test_builtin_bad_settings_are_recipe_errors(tokenizer):
    with pytest.raises(RecipeError, match="`data.name`"):
        build_data(DataConfig(name="subtraction"), tokenizer, seed=0)
    with pytest.raises(RecipeError, match="`data.format`"):
        build_data(DataConfig(format="chat"), tokenizer, seed=0)


def test_batched_generation_with_left_padding_equals_one_prompt_at_a_time(tiny_llama_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from ditty.data.task import greedy_generate

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    prompts = ["1+2=", "45+67=", "rev abcdefgh="]
    batched = greedy_generate(model, tokenizer, prompts, "cpu", max_new_tokens=6)
    alone = [greedy_generate(model, tokenizer, [prompt], "cpu", max_new_tokens=6)[0] for prompt in prompts]
    assert batched == alone
    assert any(batched)  # the random model does emit something, so the comparison means something
