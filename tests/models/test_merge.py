"""Saving adapter runs: the PEFT adapter reloads with peft and gives the trained model's logits; the
merged full model reloads with from_pretrained and gives them too (for QLoRA: the QLoRA model's
logits, not those of the full-precision base plus the adapter).

Measured on this machine (fp32, tiny Llama/Mistral, 6 training steps): merged vs trained logits
differ by at most 3.6e-7 (LoRA and DoRA 3.0e-7, QLoRA 3.6e-7) with logits of order 1; the reloaded
adapter gives exactly the trained logits; the QLoRA adapter on the full-precision base is off
by 0.11, which the QLoRA test checks is far above the tolerance. MERGE_ATOL leaves
room for other BLAS builds.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from peft import AutoPeftModelForCausalLM, PeftModel
from transformers import AutoModelForCausalLM

from ditty.config.errors import RecipeError
from ditty.config.sections import ModelConfig, PeftConfig, QuantConfig
from ditty.models import build_model
from ditty.models.adapters import LoraConverter
from ditty.models.merge import merge_to_full, save_adapter, save_merged
from ditty.models.quant import quantized_linear_count
from tests.models.test_adapters import SETUPS, TinyMLP, batch, build_adapted, logits, train_steps

MERGE_ATOL = 1e-5
ADAPTER_ATOL = 1e-6


@pytest.fixture(params=["llama", "mistral"])
def model_dir(request, tiny_llama_dir, tiny_mistral_dir):
    return {"llama": tiny_llama_dir, "mistral": tiny_mistral_dir}[request.param]


@pytest.mark.parametrize("kind", list(SETUPS))
def test_saved_adapter_and_merged_model_give_the_trained_logits(model_dir, kind, tmp_path):
    model = build_adapted(model_dir, kind)
    train_steps(model, batch())
    ids = batch(seed=1)
    trained = logits(model, ids)

    adapter_dir = save_adapter(model, str(tmp_path / "adapter"), tokenizer=None)
    if kind == "qlora":
        # The adapter belongs to the 4-bit base: reload it on the same quantized weights.
        base = build_model(ModelConfig(path=model_dir), quant=SETUPS[kind][1])
        reloaded = PeftModel.from_pretrained(base, adapter_dir)
    else:
        reloaded = AutoPeftModelForCausalLM.from_pretrained(adapter_dir)
    torch.testing.assert_close(logits(reloaded, ids), trained, rtol=0, atol=ADAPTER_ATOL)

    merged_dir = save_merged(model, str(tmp_path / "merged"))
    plain = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert not isinstance(plain, PeftModel) and quantized_linear_count(plain) == {"Linear4bit": 0, "Linear8bitLt": 0}
    assert getattr(plain.config, "quantization_config", None) is None
    assert not any(".lora_" in name or "base_layer" in name for name, _ in plain.named_parameters())
    torch.testing.assert_close(logits(plain, ids), trained, rtol=0, atol=MERGE_ATOL)
    torch.testing.assert_close(logits(model, ids), trained, rtol=0, atol=0)  # merging left the trained model alone

    if kind == "qlora":
        # The adapter corrected the 4-bit weights: on the full-precision base it computes something else.
        full_precision_plus_adapter = AutoPeftModelForCausalLM.from_pretrained(adapter_dir)
        gap = (logits(full_precision_plus_adapter, ids) - trained).abs().max().item()
        assert gap > 100 * MERGE_ATOL, gap


def test_merge_from_an_8bit_base_is_a_recipe_error(tiny_llama_dir):
    base = build_model(ModelConfig(path=tiny_llama_dir), quant=QuantConfig(kind="bnb-8bit"))
    model = LoraConverter(PeftConfig(kind="lora", r=4, target_modules=["q_proj"])).convert(base)
    with pytest.raises(RecipeError) as error:
        merge_to_full(model)
    assert error.value.problems[0].key == "checkpoint.final_format"
    assert "bnb-4bit" in error.value.problems[0].fix


def test_merge_with_modules_to_save_keeps_the_trained_copy(tiny_llama_dir, tmp_path):
    torch.manual_seed(0)
    base = build_model(ModelConfig(path=tiny_llama_dir))
    model = LoraConverter(PeftConfig(kind="lora", r=4, target_modules=["q_proj"], modules_to_save=["lm_head"])).convert(
        base
    )
    train_steps(model, batch(), steps=3)
    ids = batch(seed=2)
    plain = AutoModelForCausalLM.from_pretrained(save_merged(model, str(tmp_path / "merged")))
    torch.testing.assert_close(logits(plain, ids), logits(model, ids), rtol=0, atol=MERGE_ATOL)


def test_merge_of_a_custom_module(tmp_path):
    torch.manual_seed(0)
    model = LoraConverter(PeftConfig(kind="lora", r=4, target_modules=["hidden"])).convert(TinyMLP())
    with torch.no_grad():
        model.base_model.model.hidden.lora_B["default"].weight.normal_()  # a nonzero update to merge
    x = torch.randn(5, 8)
    merged = merge_to_full(model)
    assert isinstance(merged, TinyMLP) and isinstance(merged.hidden, torch.nn.Linear)
    with torch.no_grad(), warnings.catch_warnings():
        torch.testing.assert_close(merged(x), model(x), rtol=0, atol=MERGE_ATOL)
    assert isinstance(model, PeftModel)  # the trained model is still the adapter model
