"""Adapter runs through the Trainer: LoRA with a merged final model, QLoRA on a 4-bit base."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from ditty.config.sections import CheckpointConfig, PeftConfig, QuantConfig
from ditty.train import Trainer
from tests.train.helpers import small_config, write_prompt_completion


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lora_run_saves_adapter_and_merged_model(tmp_path, tiny_llama_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    data = write_prompt_completion(tmp_path / "pc.jsonl")
    config = small_config(tmp_path, tiny_llama_dir, data, steps=6)
    config = replace(
        config,
        peft=PeftConfig(kind="lora", r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
        optimizer=replace(config.optimizer, lr=1e-2),
        checkpoint=CheckpointConfig(final_format="merged"),
    )
    trainer = Trainer(config)
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    trainer.train()
    final = os.path.join(config.run.output_dir, "final")
    assert os.path.isfile(os.path.join(final, "adapter_config.json"))
    for name, param in trainer.model.named_parameters():
        if "lora_" not in name:
            assert not param.requires_grad and torch.equal(param, base_before[name]), name
    ids = torch.tensor([[1, 40, 41, 42, 43, 44]])
    trainer.model.eval()
    trained = logits(trainer.model, ids)
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), final)
    assert torch.allclose(logits(reloaded.eval(), ids), trained, atol=1e-5)
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(final, "merged")).eval()
    assert torch.allclose(logits(merged, ids), trained, atol=1e-5)


@pytest.mark.slow
def test_qlora_run_builds_4bit_layers_and_learns(tmp_path, tiny_llama_dir):
    import bitsandbytes as bnb

    data = write_prompt_completion(tmp_path / "pc.jsonl")
    config = small_config(tmp_path, tiny_llama_dir, data, steps=8)
    config = replace(
        config,
        peft=PeftConfig(kind="lora", r=8, alpha=16),
        quant=QuantConfig(kind="bnb-4bit"),
        optimizer=replace(config.optimizer, lr=1e-2),
    )
    trainer = Trainer(config)
    linear4bit = [m for m in trainer.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(linear4bit) == 2 * 7  # 2 layers x (q, k, v, o, gate, up, down)
    trainer.train()
    losses = [r["loss"] for r in _records(config.run.output_dir) if "loss" in r]
    assert losses[-1] < losses[0]


def _records(run_dir):
    import json

    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
