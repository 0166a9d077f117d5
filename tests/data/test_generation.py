"""Validation generation through transformers' `generate` with a KV cache gives exactly the tokens of
the uncached greedy decode (which re-runs the prefix for every token), one token per forward after
the prompt; the speed-up is measured by tools/bench.py (memory section)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ditty.data.collate import pack_rows
from ditty.data.task import greedy_generate
from ditty.data.tokenizer import byte_tokenizer
from ditty.models.packing import PACKED_SDPA, packed_inputs

PROMPTS = ["1+2=", "45+67=", "rev abcdefgh=", "", "a much longer prompt than the others, left-padded="]


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture
def model(tiny_llama_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)


def test_cached_generation_gives_the_tokens_of_the_uncached_decode(model, tokenizer):
    cached = greedy_generate(model, tokenizer, PROMPTS, "cpu", max_new_tokens=64)
    uncached = greedy_generate(model, tokenizer, PROMPTS, "cpu", max_new_tokens=64, use_cache=False)
    assert cached == uncached
    assert all(len(text) > 8 for text in cached)  # the random model runs on, so 64 tokens are compared


def test_after_the_prompt_each_forward_takes_one_new_token(model, tokenizer):
    widths = []
    model.register_forward_pre_hook(
        lambda m, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    greedy_generate(model, tokenizer, PROMPTS[:2], "cpu", max_new_tokens=16)
    assert widths[0] == max(len(tokenizer(p)["input_ids"]) for p in PROMPTS[:2])
    assert set(widths[1:]) == {1} and 1 <= len(widths) <= 16


def test_generation_after_packed_training_is_unchanged(model, tokenizer):
    """A packed step switches sdpa to PACKED_SDPA; without cumulative lengths it is sdpa again."""
    before = greedy_generate(model, tokenizer, PROMPTS, "cpu", max_new_tokens=12)
    with torch.no_grad():
        batch = pack_rows([[([5, 6, 7], [5, 6, 7]), ([8, 9], [8, 9])]], 0)
        model(**packed_inputs(model, batch, choice="per-sample"), use_cache=False)
    assert model.config._attn_implementation == PACKED_SDPA
    assert greedy_generate(model, tokenizer, PROMPTS, "cpu", max_new_tokens=12) == before
