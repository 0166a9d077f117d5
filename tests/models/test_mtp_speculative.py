"""Decoding with the MTP heads' drafts (ditty.models.mtp.speculative) gives greedy decoding's tokens:
transformers' own greedy `generate`, with heads that draft badly, with heads whose every draft is
accepted, and with heads of a run that learned to draft (tests/train/test_mtp_run.py)."""

from __future__ import annotations

import pytest
import torch

from ditty.models.mtp.heads import heads_of
from ditty.models.mtp.speculative import greedy_decode
from tests.models.mtp_helpers import tiny_model

PROMPTS = [[5, 9, 14], [7], [40, 3, 40, 3, 40, 3, 40]]


def transformers_greedy(model, prompt: list[int], max_new_tokens: int, eos) -> list[int]:
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0)
    out = model.generate(input_ids=torch.tensor([prompt]), generation_config=config)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize(
    "model_type, attention", [("llama", "sdpa"), ("llama", "eager"), ("qwen3", "sdpa"), ("deepseek_v3", "sdpa")]
)
@pytest.mark.parametrize("depth", [1, 3])
def test_drafted_decoding_gives_greedy_decodings_tokens(model_type, attention, depth):
    model = tiny_model(model_type, depth=depth, seed=3, attn_implementation=attention).eval()
    assert model.config._attn_implementation == attention
    heads = heads_of(model)
    drafted = 0
    for prompt in PROMPTS:
        expected = transformers_greedy(model, prompt, 12, eos=2)
        plain, plain_stats = greedy_decode(model, prompt, 12, 2)
        tokens, stats = greedy_decode(model, prompt, 12, 2, heads)
        assert plain == expected and tokens == expected
        assert plain_stats.model_forwards == len(expected)  # one token per forward without drafts
        assert stats.model_forwards <= plain_stats.model_forwards
        assert stats.new_tokens == len(expected)
        drafted += stats.drafted
    assert drafted > 0


def test_when_every_draft_is_accepted_each_forward_gives_depth_plus_one_tokens():
    # Zero final norms: every state is zero, so every head (main and drafts) picks token 0, which is
    # greedy's choice after any prefix: every draft is accepted.
    model = tiny_model("llama", depth=3).eval()
    with torch.no_grad():
        model.model.norm.weight.zero_()
        for layer in heads_of(model).layers:
            layer.post_norm.weight.zero_()
    tokens, stats = greedy_decode(model, [5, 6, 7], 13, eos_token_id=None, heads=heads_of(model))
    assert tokens == transformers_greedy(model, [5, 6, 7], 13, eos=None) == [0] * 13
    assert stats.accepted == stats.drafted == 9
    assert stats.model_forwards == 4  # the prefill's token, then 4 tokens per verifying forward
    tokens, stats = greedy_decode(model, [5, 6, 7], 7, eos_token_id=None, heads=heads_of(model))
    assert tokens == [0] * 7 and stats.model_forwards == 3 and stats.drafted == 3 + 1  # none past the end
