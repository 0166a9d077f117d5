"""Planned parameter, gradient and optimizer-state bytes against the real tensors, exactly: the
model built by ditty's own builders (bitsandbytes 4-bit, peft adapters), one real step of each
optimizer, and the byte counters of ditty.parallel.memory (what env.json reports)."""

from __future__ import annotations

import pytest
import torch

from ditty.config import TrainerConfig
from ditty.config.sections import ModelConfig, OptimizerConfig, PeftConfig, QuantConfig, RunConfig
from ditty.plan import Target, make_plan
from ditty.plan.parameters import local_rows


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("llama")
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


CASES = {
    "full, AdamW": {},
    "full, 8-bit AdamW (torchao)": dict(optimizer=OptimizerConfig(kind="adamw8bit")),
    "full, 8-bit AdamW (bitsandbytes)": dict(optimizer=OptimizerConfig(kind="adamw8bit", backend="bnb")),
    "full, SGD with momentum": dict(optimizer=OptimizerConfig(kind="sgd", momentum=0.9)),
    "full, Muon + AdamW": dict(optimizer=OptimizerConfig(kind="muon", weight_decay=0.1)),
    "full, Adafactor": dict(optimizer=OptimizerConfig(kind="adafactor")),
    "full, RAdam": dict(optimizer=OptimizerConfig(kind="radam")),
    "full, schedule-free AdamW": dict(optimizer=OptimizerConfig(kind="adamw_schedulefree")),
    "LoRA + Muon (the adapter matrices)": dict(
        peft=PeftConfig(kind="lora", r=4, modules_to_save=["lm_head"]), optimizer=OptimizerConfig(kind="muon")
    ),
    "DoRA + Adafactor": dict(peft=PeftConfig(kind="dora", r=4), optimizer=OptimizerConfig(kind="adafactor")),
    "LoRA all-linear": dict(peft=PeftConfig(kind="lora", r=8)),
    "LoRA q,v + trained head": dict(
        peft=PeftConfig(kind="lora", r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    ),
    "DoRA": dict(peft=PeftConfig(kind="dora", r=8)),
    "QLoRA": dict(peft=PeftConfig(kind="lora", r=8), quant=QuantConfig(kind="bnb-4bit")),
    "QLoRA without double quantization": dict(
        peft=PeftConfig(kind="lora", r=8), quant=QuantConfig(kind="bnb-4bit", double_quant=False)
    ),
}


# torchao compiles its 8-bit update on the first step (inductor and a C++ compiler): minutes on a busy CPU.
SLOW_CASES = {"full, 8-bit AdamW (torchao)"}


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=pytest.mark.slow) if case in SLOW_CASES else case for case in CASES]
)
def test_state_bytes_are_exact(model_dir, case):
    from ditty.models.adapters import LoraConverter
    from ditty.models.build import build_model
    from ditty.optim import build_optimizer
    from ditty.parallel.memory import gradient_bytes, optimizer_state_bytes, parameter_bytes

    config = TrainerConfig(run=RunConfig(device="cpu"), model=ModelConfig(path=model_dir), **CASES[case])
    model = build_model(config.model, device="cpu", quant=config.quant)
    if config.peft.kind != "none":
        model = LoraConverter(config.peft).convert(model)
    optimizer = build_optimizer(config.optimizer, model)
    if hasattr(optimizer, "train"):  # schedule-free steps in train mode
        optimizer.train()
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    measured_gradients = gradient_bytes(model.parameters())
    optimizer.step()
    state = make_plan(config, Target(device="cpu"), with_knobs=False).memory.kinds[0].state
    assert state.parameter_total == parameter_bytes(model)
    assert state.gradients == measured_gradients
    assert state.optimizer == optimizer_state_bytes(optimizer)
    if config.quant.kind == "bnb-4bit":
        assert state.quant_states == _quant_state_bytes(model)


def _quant_state_bytes(model) -> int:
    total = 0
    for parameter in model.parameters():
        qs = getattr(parameter, "quant_state", None)
        if qs is None:
            continue
        tensors = [qs.absmax, qs.code] + ([qs.state2.absmax, qs.state2.code, qs.offset] if qs.nested else [])
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total


def test_fsdp_rows_follow_torch_chunk():
    for rows in (1, 7, 64, 65, 300):
        for shards in (1, 2, 3, 8):
            expected = [c.shape[0] for c in torch.arange(rows).chunk(shards)]
            expected += [0] * (shards - len(expected))
            assert [local_rows(rows, shards, i) for i in range(shards)] == expected
