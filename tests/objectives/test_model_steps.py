"""The objectives on a real (tiny) causal LM, as the trainer will run them: pairs through one forward,
completion log-probabilities in chunks, a reference that is a DIFFERENT checkpoint; one step equals
the textbook full-logits DPO, and micro-batches of any size with the global count give the same
loss and parameter gradients as the whole batch (DPO and GRPO)."""

from __future__ import annotations

import math

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ditty.objectives.dpo_family import dpo_loss
from ditty.objectives.logprobs import concatenate_pairs, model_token_logps, sequence_logps, split_pairs
from ditty.objectives.rl.grpo import grpo_loss, loss_mask

VOCAB, PROMPT = 64, 4


def tiny(seed):
    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        "llama",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(config).to(torch.float64)


def side(count, seed, lengths):
    """Rows of a 4-token prompt (shared per pair) and a completion of the given length, right-padded."""
    generator = torch.Generator().manual_seed(seed)
    width = PROMPT + max(lengths)
    ids = torch.zeros(count, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    prompts = torch.randint(3, VOCAB, (count, PROMPT), generator=torch.Generator().manual_seed(99))
    for row, length in enumerate(lengths):
        ids[row, :PROMPT] = prompts[row]
        ids[row, PROMPT : PROMPT + length] = torch.randint(3, VOCAB, (length,), generator=generator)
        mask[row, : PROMPT + length] = 1
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :PROMPT] = -100
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


CHOSEN = side(4, 1, [3, 5, 2, 4])
REJECTED = side(4, 2, [4, 2, 6, 3])


def rows(batch, picked):
    return {key: value[picked] for key, value in batch.items()}


def textbook_sequence_logps(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    target = batch["labels"][:, 1:]
    picked = torch.log_softmax(logits[:, :-1], -1).gather(2, target.clamp_min(0)[..., None])[..., 0]
    return (picked * (target != -100)).sum(-1)


def dpo_step(policy, reference, picked, global_pairs):
    batch = concatenate_pairs(rows(CHOSEN, picked), rows(REJECTED, picked), pad_id=0)
    with torch.no_grad():
        reference_logps = sequence_logps(*model_token_logps(reference, batch))[0]
    policy_logps = sequence_logps(*model_token_logps(policy, batch, chunks=3))[0]
    out = dpo_loss(*split_pairs(policy_logps), *split_pairs(reference_logps), global_pairs=global_pairs, beta=0.1)
    out.loss.backward()
    return out


def test_one_dpo_step_equals_the_textbook_full_logits_formula():
    policy, reference = tiny(0), tiny(1)
    out = dpo_step(policy, reference, slice(0, 4), 4)
    with torch.no_grad():
        pc, rc = textbook_sequence_logps(policy, CHOSEN), textbook_sequence_logps(reference, CHOSEN)
        pr, rr = textbook_sequence_logps(policy, REJECTED), textbook_sequence_logps(reference, REJECTED)
    expected = (
        sum(math.log1p(math.exp(-0.1 * ((pc[i] - rc[i]) - (pr[i] - rr[i])).item())) for i in range(4)) / 4
    )  # -log sigmoid(x) = log(1 + exp(-x))
    assert abs(out.loss.item() - expected) < 1e-6


def test_dpo_micro_batches_give_the_whole_batch_loss_and_gradients():
    policy, reference = tiny(0), tiny(1)
    whole = dpo_step(policy, reference, slice(0, 4), 4)
    whole_grads = {name: p.grad.clone() for name, p in policy.named_parameters()}
    policy.zero_grad()
    parts = [dpo_step(policy, reference, picked, 4) for picked in (slice(0, 1), slice(1, 4))]
    assert abs(sum(p.loss.item() for p in parts) - whole.loss.item()) < 1e-10
    for name, value in whole.metrics.items():
        assert abs(sum(p.metrics[name].item() for p in parts) - value.item()) < 1e-10, name
    for name, param in policy.named_parameters():
        torch.testing.assert_close(param.grad, whole_grads[name], atol=1e-10, rtol=0, msg=name)


def test_grpo_micro_batches_give_the_whole_batch_loss_and_gradients():
    """Four completions of varied lengths, one truncated and masked; old log-probabilities from the
    policy before a perturbation, so the ratios are not 1; DAPO normalisation, sequence importance."""
    policy, reference = tiny(0), tiny(1)
    batch = CHOSEN
    with torch.no_grad():
        old, _ = model_token_logps(tiny(2), batch)
        ref, _ = model_token_logps(reference, batch)
    advantages = torch.tensor([1.0, -0.5, 0.25, -0.75], dtype=torch.float64)
    truncated = torch.tensor([False, True, False, False])

    def step(picked, global_sequences, global_tokens):
        part = rows(batch, picked)
        logps, scored = model_token_logps(policy, part, chunks=2)
        mask = loss_mask(scored, truncated[picked], mask_truncated=True)
        out = grpo_loss(
            logps,
            old[picked],
            advantages[picked],
            mask,
            global_sequences=global_sequences,
            global_tokens=global_tokens,
            reference_logps=ref[picked],
            beta=0.04,
            clip_high=0.28,
            importance="sequence",
            loss="dapo",
        )
        out.loss.backward()
        return out, int(mask.sum())

    _, scored = model_token_logps(policy, batch)
    tokens = int(loss_mask(scored, truncated, mask_truncated=True).sum())
    policy.zero_grad()
    whole, _ = step(slice(0, 4), 4, tokens)
    whole_grads = {name: p.grad.clone() for name, p in policy.named_parameters()}
    policy.zero_grad()
    parts = [step(picked, 4, tokens)[0] for picked in (slice(0, 2), slice(2, 4))]
    assert abs(sum(p.loss.item() for p in parts) - whole.loss.item()) < 1e-10
    for name, param in policy.named_parameters():
        torch.testing.assert_close(param.grad, whole_grads[name], atol=1e-10, rtol=0, msg=name)
