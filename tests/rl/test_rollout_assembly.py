"""How sampled completions become training rows: the rows the loss scores must carry exactly the
log-probabilities the completions were sampled with (left-padded prompts in `generate`, right-padded
rows in training), so the first update of an on-policy step has ratio 1."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from ditty._utils.labels import IGNORE_INDEX
from ditty.config.sections import ModelConfig, TokenizerConfig
from ditty.data.tokenizer import build_tokenizer
from ditty.objectives.logprobs import model_token_logps
from ditty.objectives.rl.assembler import Assembler
from ditty.objectives.sampling.generate_sampler import GenerateSampler, sampling_seed, takes_prompt_cache
from tests.rl.helpers import TINY_LLAMA

GROUP = 4


@pytest.fixture(scope="module")
def setup():
    tokenizer = build_tokenizer(TokenizerConfig(kind="byte"), ModelConfig(init="random", architecture="llama"))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_LLAMA,
    )
    model = LlamaForCausalLM(config)
    # prompts of different lengths: generate left-pads them, the training rows right-pad them
    prompts = ["3+1=", "45+60=", "7+9=", "88+99=", "100+2="]
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    rl = types.SimpleNamespace(
        group_size=GROUP,
        max_new_tokens=5,
        temperature=0.7,
        top_p=1.0,
        generation_batch_size=None,
        mask_truncated=False,
        updates_per_rollout=1,
        beta=0.0,
    )
    done = sampler(rl, tokenizer, model).sample(prompt_ids, 0)
    return types.SimpleNamespace(tokenizer=tokenizer, model=model, rl=rl, done=done, ids=prompt_ids)


def sampler(rl, tokenizer, model) -> GenerateSampler:
    """The sampler of one process drawing from `model`, seeded as a run with seed 0."""
    return GenerateSampler(lambda: model, rl, rl.group_size, tokenizer, torch.device("cpu"), seed=0)


def training_rows(s, advantages):
    """The rollouts as the assembler hands them to the trainer: one micro-batch, every row."""
    s.done.advantages = advantages
    return Assembler(s.rl, s.rl, pad_token_id=s.tokenizer.pad_token_id, micro_batch_size=64)(s.done, drop_idle=False)[0]


def sampled_logps(model, batch, rl):
    return model_token_logps(model, batch, temperature=rl.temperature)[0]


def generate_from_whole_prompts(s, model, **outputs):
    """`generate` on every prompt repeated GROUP times, left-padded, with the stream's sampling settings
    and its seed for the first prompt: what the rollouts must equal. Returns (output, prompt width)."""
    tok = s.tokenizer
    chunk = [ids for ids in s.ids for _ in range(GROUP)]
    width = max(len(ids) for ids in chunk)
    input_ids = torch.tensor([[tok.pad_token_id] * (width - len(ids)) + ids for ids in chunk])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk])
    config = GenerationConfig(
        max_new_tokens=s.rl.max_new_tokens,
        do_sample=True,
        temperature=s.rl.temperature,
        top_p=1.0,
        top_k=0,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **outputs,
    )
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(sampling_seed(0, 0))
        return model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config), width


def sampling_logps(s) -> list[torch.Tensor]:
    """The log-probabilities `generate` sampled each completion token with (its own processed logits)."""
    out, width = generate_from_whole_prompts(
        s, s.model, output_logits=True, output_scores=True, return_dict_in_generate=True
    )
    logps = torch.stack([(logits.float() / s.rl.temperature).log_softmax(-1) for logits in out.logits], 1)
    # what generate sampled from: the logits divided by the temperature and nothing else (no top_k,
    # repetition penalty or other default of the model's generation_config)
    sampled_from = torch.stack([scores.float().log_softmax(-1) for scores in out.scores], 1)
    torch.testing.assert_close(sampled_from, logps, atol=1e-5, rtol=0)
    rows = []
    for row, completion in enumerate(s.done.completion_ids):
        assert out.sequences[row, width : width + len(completion)].tolist() == completion
        rows.append(logps[row, torch.arange(len(completion)), torch.tensor(completion)])
    return rows


def test_training_rows_carry_the_sampling_log_probabilities(setup):
    s = setup
    batch = training_rows(s, torch.zeros(len(s.done.texts)))
    s.model.train()  # the trainer's mode: must not change the forward (no dropout)
    with torch.no_grad():
        trained = sampled_logps(s.model, batch, s.rl)
    s.model.eval()
    expected = sampling_logps(s)
    for row, want in enumerate(expected):
        scored = batch["labels"][row] != IGNORE_INDEX
        assert int(scored.sum()) == len(want)
        torch.testing.assert_close(trained[row, scored], want, atol=1e-5, rtol=0)


def test_rows_are_grouped_and_cut_at_the_end_of_sequence(setup):
    s = setup
    eos = s.tokenizer.eos_token_id
    batch = training_rows(s, torch.arange(len(s.done.texts)).float())
    assert any(not t for t in s.done.truncated) and any(s.done.truncated)  # both kinds are covered
    for row, completion in enumerate(s.done.completion_ids):
        prompt = s.ids[row // GROUP]  # a group is `group_size` consecutive rows of one prompt
        assert s.done.prompt_ids[row] == prompt
        labels = batch["labels"][row]
        scored = labels[labels != IGNORE_INDEX].tolist()
        assert scored == completion  # the generated ids themselves, never re-encoded text
        assert batch["input_ids"][row, : len(prompt) + len(completion)].tolist() == prompt + completion
        assert int(batch["attention_mask"][row].sum()) == len(prompt) + len(completion)
        if s.done.truncated[row]:
            assert eos not in completion and len(completion) == s.rl.max_new_tokens
        else:
            assert completion.count(eos) == 1 and completion[-1] == eos  # EOS is scored, nothing after it
            assert s.done.texts[row] == s.tokenizer.decode(completion[:-1], skip_special_tokens=True)
        assert float(batch["advantages"][row]) == row


def test_an_adapted_policy_samples_from_its_prompt_cache_what_whole_prompts_sample(setup):
    """Under LoRA the policy is a PeftModel: the prompts' KV cache (computed once per group) goes
    through the adapter too, so the stream samples what `generate` samples from the whole prompts."""
    import copy

    from peft import LoraConfig, get_peft_model

    s = setup
    torch.manual_seed(3)
    model = get_peft_model(copy.deepcopy(s.model), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, param in model.named_parameters():
        if "lora_B" in name:  # a live adapter (B starts at 0)
            torch.nn.init.normal_(param, std=0.5)
    done = sampler(s.rl, s.tokenizer, model).sample(s.ids, 0)
    whole, width = generate_from_whole_prompts(s, model)
    plain = s.done.completion_ids
    assert [whole[row, width : width + len(c)].tolist() for row, c in enumerate(done.completion_ids)] == (
        done.completion_ids
    )
    assert done.completion_ids != plain  # the adapter changed what is sampled
    assert takes_prompt_cache(model) and takes_prompt_cache(s.model)  # both sampled from the prompt cache
