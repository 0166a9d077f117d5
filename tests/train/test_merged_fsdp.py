"""`checkpoint.final_format = "merged"` under FSDP on 2 gloo ranks: rank 0 merges the adapter into the
full state dict gathered from the shards (for QLoRA: into the dequantized 4-bit weights) and writes
`final/merged/`, which `from_pretrained` loads and which computes what the saved adapter computes on
its base (the 4-bit base for QLoRA). Tolerance: tests/models/test_merge.py's MERGE_ATOL.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

MERGE_ATOL = 1e-5


def _train_all(rank: int, world: int, configs: list) -> None:
    from ditty.train import Trainer

    for config in configs:
        Trainer(config).train()


def _config(tmp_path, model_dir: str, data: str, name: str, quant=None):
    from ditty.config.sections import CheckpointConfig, ParallelConfig, PeftConfig, QuantConfig
    from tests.train.helpers import small_config

    config = small_config(tmp_path / name, model_dir, data, steps=3, micro_batch_size=2)
    config = replace(
        config,
        peft=PeftConfig(kind="lora", r=4, alpha=8),
        parallel=ParallelConfig(kind="fsdp"),
        checkpoint=CheckpointConfig(final_format="merged"),
        optimizer=replace(config.optimizer, lr=1e-2),
    )  # a visible adapter after 3 steps
    if quant:  # FSDP flattens a block in one dtype: the packed 4-bit bytes are viewed as fp32
        config = replace(config, quant=QuantConfig(kind=quant, storage_dtype="float32"))
    return config


def test_fsdp_writes_a_merged_final_model_matching_the_adapter(tmp_path, tiny_llama_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ditty.config.sections import ModelConfig
    from ditty.models import build_model
    from ditty.models.quant import keep_4bit_layout_fixed, quantized_linear_count
    from tests.train.helpers import write_prompt_completion

    data = write_prompt_completion(tmp_path / "pc.jsonl")
    configs = [
        _config(tmp_path, tiny_llama_dir, data, "lora"),
        _config(tmp_path, tiny_llama_dir, data, "qlora", "bnb-4bit"),
    ]
    run_ranks(_train_all, 2, configs, timeout=300)
    ids = torch.tensor([[1, 40, 41, 42, 43, 44, 45, 46]])
    for config in configs:
        final = os.path.join(config.run.output_dir, "final")
        base = build_model(
            ModelConfig(path=tiny_llama_dir), quant=config.quant if config.quant.kind != "none" else None
        )
        adapter = keep_4bit_layout_fixed(PeftModel.from_pretrained(base, final)).eval()
        merged = AutoModelForCausalLM.from_pretrained(os.path.join(final, "merged")).eval()
        assert quantized_linear_count(merged) == {"Linear4bit": 0, "Linear8bitLt": 0}
        assert not any("lora_" in name or "base_layer" in name for name, _ in merged.named_parameters())
        with torch.no_grad():
            expected, got = adapter(input_ids=ids).logits, merged(input_ids=ids).logits
        gap = (got - expected).abs().max().item()
        print(f"{config.quant.kind}: merged vs adapter logits, max abs difference {gap:.2e}")
        torch.testing.assert_close(got, expected, rtol=0, atol=MERGE_ATOL)
        with torch.no_grad(), adapter.disable_adapter():  # the adapter moved the logits: the merge is not a no-op
            assert (adapter(input_ids=ids).logits - expected).abs().max().item() > 100 * MERGE_ATOL
