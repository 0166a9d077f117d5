"""Completion log-probabilities from hidden states in chunks (ditty.objectives.logprobs) equal the
full-logits computation, values and gradients, and never allocate the [tokens, vocab] logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM

from ditty.objectives.logprobs import (
    concatenate_pairs,
    model_token_logps,
    sequence_logps,
    split_pairs,
    token_logps,
)
from ditty.stages.fused_loss import Projection

VOCAB = 300


def tiny_llama(dtype=torch.float64, **overrides):
    torch.manual_seed(0)
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    config = AutoConfig.for_model("llama", **{**settings, **overrides})
    return AutoModelForCausalLM.from_config(config).to(dtype)


def rows(count, width, prompt, seed):
    """Right-padded rows: `prompt` unscored tokens, a completion, then padding of varying length."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (count, width), generator=generator)
    labels = ids.clone()
    labels[:, :prompt] = -100
    mask = torch.ones_like(ids)
    for row in range(count):
        pad = row % 3
        if pad:
            ids[row, -pad:], labels[row, -pad:], mask[row, -pad:] = 0, -100, 0
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def full_logits_sequence_logps(model, batch):
    """The textbook way: all logits, log-softmax, gather the next token, sum over completion tokens."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logprobs = torch.log_softmax(logits[:, :-1].to(torch.float64), dim=-1)
    target = batch["labels"][:, 1:]
    keep = target != -100
    picked = logprobs.gather(2, target.clamp_min(0)[..., None]).squeeze(-1)
    return (picked * keep).sum(-1), keep.sum(-1)


def test_chunked_sequence_logps_equal_full_logits_values_and_gradients():
    model = tiny_llama()
    batch = rows(4, 20, prompt=7, seed=1)

    model.zero_grad()
    expected, expected_counts = full_logits_sequence_logps(model, batch)
    weights = torch.tensor([0.3, -1.2, 0.7, 2.0], dtype=torch.float64)  # a different gradient per sequence
    (expected * weights).sum().backward()
    expected_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad()
    logps, scored = model_token_logps(model, batch, chunks=3)
    got, counts = sequence_logps(logps, scored)
    (got * weights).sum().backward()

    assert torch.equal(counts, expected_counts)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected_grads[name], atol=1e-6, rtol=0, msg=name)


def test_fp32_model_matches_full_logits_to_1e6_per_token():
    model = tiny_llama(torch.float32)
    batch = rows(3, 16, prompt=5, seed=2)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.double()
        logps, scored = model_token_logps(model, batch, chunks=4)
    full = torch.log_softmax(logits[:, :-1], -1).gather(2, batch["labels"][:, 1:].clamp_min(0)[..., None])[..., 0]
    assert torch.equal(scored[:, 1:], batch["labels"][:, 1:] != -100) and not scored[:, 0].any()
    torch.testing.assert_close(logps[:, 1:].double(), full * scored[:, 1:], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("softcap,scale,bias", [(None, 1.0, False), (5.0, 0.5, True)])
def test_head_transforms_match_the_textbook_formula(softcap, scale, bias):
    """Bias, logit scale (cohere/granite) and softcap (gemma2): values and every gradient."""
    torch.manual_seed(3)
    hidden = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    b = torch.randn(40, dtype=torch.float64, requires_grad=True) if bias else None
    labels = torch.randint(0, 40, (2, 9))
    labels[0, :3] = -100
    incoming = torch.randn(2, 9, dtype=torch.float64)

    logits = F.linear(hidden * scale, weight, b)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    full = torch.log_softmax(logits[:, :-1], -1).gather(2, labels[:, 1:].clamp_min(0)[..., None])[..., 0]
    keep = labels[:, 1:] != -100
    expected = torch.cat([torch.zeros(2, 1, dtype=torch.float64), full * keep], 1)
    expected_grads = torch.autograd.grad((expected * incoming).sum(), [hidden, weight] + ([b] if bias else []))

    logps, _ = token_logps(hidden, Projection(weight, b, scale=scale, softcap=softcap), labels, chunks=4)
    grads = torch.autograd.grad((logps * incoming).sum(), [hidden, weight] + ([b] if bias else []))
    torch.testing.assert_close(logps, expected, atol=1e-10, rtol=0)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_pairs_in_one_forward_give_each_side_its_own_logps():
    """Chosen and rejected of different lengths, stacked and padded: the same log-probabilities as
    each side on its own (right padding changes nothing a causal model sees)."""
    model = tiny_llama()
    chosen, rejected = rows(3, 14, prompt=5, seed=4), rows(3, 19, prompt=5, seed=5)
    rejected["input_ids"][:, :5] = chosen["input_ids"][:, :5]  # one prompt per pair
    batch = concatenate_pairs(chosen, rejected, pad_id=0)
    assert batch["input_ids"].shape == (6, 19)
    with torch.no_grad():
        together = sequence_logps(*model_token_logps(model, batch))[0]
        alone = [sequence_logps(*model_token_logps(model, side))[0] for side in (chosen, rejected)]
    got_chosen, got_rejected = split_pairs(together)
    torch.testing.assert_close(got_chosen, alone[0], atol=1e-10, rtol=0)
    torch.testing.assert_close(got_rejected, alone[1], atol=1e-10, rtol=0)


def test_no_full_logits_are_ever_allocated():
    model = tiny_llama(torch.float32, vocab_size=4096, hidden_size=32, intermediate_size=64)
    batch = rows(4, 64, prompt=4, seed=6)
    batch["input_ids"] = batch["input_ids"] % 4096
    scored_tokens = int((batch["labels"][:, 1:] != -100).sum())

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.largest = max(Largest.largest, t.numel())
            return out

    with Largest():
        logps, scored = model_token_logps(model, batch, chunks=8)
        sequence_logps(logps, scored)[0].sum().backward()
    one_chunk = -(-scored_tokens // 8) * 4096
    assert Largest.largest <= max(one_chunk, 4096 * 32)  # one chunk of logits, or the head's weight itself
    assert Largest.largest < scored_tokens * 4096 // 4
    with Largest():  # the control: the textbook path does allocate them
        full_logits_sequence_logps(model, batch)
    assert Largest.largest >= scored_tokens * 4096


def test_rows_without_completion_tokens_give_zero_and_still_reach_the_weights():
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    labels = torch.full((2, 5), -100)
    logps, scored = token_logps(hidden, Projection(weight), labels)
    assert not scored.any() and torch.equal(logps, torch.zeros(2, 5))
    logps.sum().backward()
    assert weight.grad is not None and hidden.grad is not None


def test_pairs_must_match_in_number():
    one, two = rows(1, 6, 2, 0), rows(2, 6, 2, 0)
    with pytest.raises(ValueError, match="every pair has one of each"):
        concatenate_pairs(one, two, pad_id=0)
    with pytest.raises(ValueError, match="even number"):
        split_pairs(torch.zeros(3))


def test_same_head_as_the_fused_cross_entropy_in_bf16():
    """The completion log-probabilities sum to minus the fused cross-entropy of train.loss_chunks
    (the same head, the same tokens), also for bf16 hidden states and weights."""
    from ditty.stages.fused_loss import fused_linear_cross_entropy, shifted

    torch.manual_seed(4)
    hidden = torch.randn(3, 12, 32, dtype=torch.bfloat16)
    weight = torch.randn(50, 32, dtype=torch.bfloat16) * 0.2
    labels = torch.randint(0, 50, (3, 12))
    labels[:, :4] = -100
    logps, _ = token_logps(hidden, Projection(weight, softcap=8.0), labels, chunks=5)
    total, count = fused_linear_cross_entropy(
        hidden, Projection(weight, softcap=8.0), shifted(labels), chunks=2, backend="chunked"
    )
    assert logps.dtype == torch.float32 and int(count) == 3 * 8
    torch.testing.assert_close(-logps.sum(), total, atol=1e-3, rtol=1e-5)


def test_lora_policy_and_its_base_as_the_reference_without_a_second_copy():
    """preference.reference = "auto" with an adapter: the reference is the same model with the
    adapter disabled. LoRA on the output head too: the adapter's head update is in the projection."""
    from peft import LoraConfig, get_peft_model

    base = tiny_llama()
    batch = rows(2, 12, prompt=4, seed=7)
    with torch.no_grad():
        base_logps = sequence_logps(*model_token_logps(base, batch))[0]
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "lm_head"])
    model = get_peft_model(base, config)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # a trained adapter, not the zero-initialised one
            torch.nn.init.normal_(param, std=0.2)
    policy = sequence_logps(*model_token_logps(model, batch))[0]
    with torch.no_grad(), model.disable_adapter():
        reference = sequence_logps(*model_token_logps(model, batch))[0]
    expected, _ = full_logits_sequence_logps(model, batch)
    torch.testing.assert_close(policy, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(reference, base_logps, atol=1e-10, rtol=0)
    assert (policy - reference).abs().min() > 1e-3  # the adapter changes every sequence
    policy.sum().backward()
    lora_grads = [p.grad for n, p in model.named_parameters() if "lora_" in n and "lm_head" in n]
    assert lora_grads and all(g is not None and g.abs().sum() > 0 for g in lora_grads)
