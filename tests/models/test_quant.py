"""Quantized loading with bitsandbytes (really run on this CPU, not mocked): the config mapping,
what build_model refuses, 4-bit storage, 8-bit LoRA, the DoRA-on-8-bit crash the compiler's
compat.dora-8bit rule is based on, and the CPU repacking that ditty switches off."""

from __future__ import annotations

import warnings

import bitsandbytes as bnb
import pytest
import torch

from ditty.config.errors import RecipeError
from ditty.config.sections import ModelConfig, PeftConfig, QuantConfig
from ditty.models import build_model
from ditty.models.adapters import LoraConverter, adapted_module_names
from ditty.models.quant import bnb_config, prepare_quantized_for_training, quantized_linear_count
from tests.models.test_adapters import batch, frozen_base_snapshot, logits, train_steps


def test_bnb_config_maps_every_4bit_option():
    config = bnb_config(
        QuantConfig(
            kind="bnb-4bit", quant_type="fp4", double_quant=False, compute_dtype="bfloat16", storage_dtype="bfloat16"
        )
    )
    assert config.load_in_4bit and not config.load_in_8bit
    assert config.bnb_4bit_quant_type == "fp4"
    assert config.bnb_4bit_use_double_quant is False
    assert config.bnb_4bit_compute_dtype == torch.bfloat16
    assert config.bnb_4bit_quant_storage == torch.bfloat16
    default = bnb_config(QuantConfig(kind="bnb-4bit"))
    assert (default.bnb_4bit_quant_type, default.bnb_4bit_use_double_quant, default.bnb_4bit_quant_storage) == (
        "nf4",
        True,
        torch.uint8,
    )


def test_bnb_config_8bit_is_llm_int8():
    config = bnb_config(QuantConfig(kind="bnb-8bit"))
    assert config.load_in_8bit and not config.load_in_4bit
    assert config.llm_int8_threshold == 6.0


@pytest.mark.parametrize(
    "model",
    [ModelConfig(init="random", architecture="llama"), ModelConfig(factory="tests.models.factories:tiny_mlp")],
    ids=["random-init", "factory"],
)
def test_quantizing_anything_but_pretrained_weights_is_refused(model):
    with pytest.raises(RecipeError) as error:
        build_model(model, quant=QuantConfig(kind="bnb-4bit"))
    assert error.value.problems[0].key == "quant.kind"


def test_no_quant_leaves_build_model_as_it_was(tiny_llama_dir):
    model = build_model(ModelConfig(path=tiny_llama_dir), quant=QuantConfig())
    assert quantized_linear_count(model) == {"Linear4bit": 0, "Linear8bitLt": 0}


@pytest.mark.parametrize("storage", ["uint8", "float32"])
def test_4bit_loading_quantizes_every_block_linear_with_the_asked_storage(tiny_llama_dir, storage):
    model = build_model(
        ModelConfig(path=tiny_llama_dir), quant=QuantConfig(kind="bnb-4bit", quant_type="fp4", storage_dtype=storage)
    )
    assert quantized_linear_count(model)["Linear4bit"] == 14  # 7 per layer; lm_head stays full precision
    assert not isinstance(model.lm_head, bnb.nn.Linear4bit)
    weight = model.model.layers[0].self_attn.q_proj.weight
    assert type(weight).__name__ == "Params4bit"
    assert weight.dtype == getattr(torch, storage)
    assert weight.quant_state.quant_type == "fp4"


def test_8bit_loading_with_lora_trains_and_keeps_the_int8_base(tiny_llama_dir):
    torch.manual_seed(0)
    base = build_model(ModelConfig(path=tiny_llama_dir), quant=QuantConfig(kind="bnb-8bit"))
    assert quantized_linear_count(base)["Linear8bitLt"] == 14
    model = LoraConverter(
        PeftConfig(kind="lora", r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    ).convert(base)
    assert len(adapted_module_names(model)) == 6
    before = frozen_base_snapshot(model)
    losses = train_steps(model, batch())
    assert losses[-1] < losses[0] - 0.1, losses
    after = frozen_base_snapshot(model)
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight.dtype == torch.int8


def test_dora_on_8bit_layers_crashes_on_the_second_forward_with_peft_0_21(tiny_llama_dir):
    """The evidence for the compiler's compat.dora-8bit rule (peft 0.21.2, bitsandbytes 0.50.2, CPU).

    peft accepts DoRA on Linear8bitLt and the first forward (and backward) runs; the second forward,
    with or without grad, fails inside bitsandbytes' int8 matmul (`col_stats` is None): DoRA's
    weight-norm computation dequantizes the int8 weight and leaves the layer's state unusable.
    If this test starts failing, the crash is gone: turn the rule into a warning or drop it.
    """
    base = build_model(ModelConfig(path=tiny_llama_dir), quant=QuantConfig(kind="bnb-8bit"))
    model = LoraConverter(PeftConfig(kind="dora", r=4, target_modules=["q_proj"])).convert(base)
    ids = batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(input_ids=ids, labels=ids).loss.backward()  # the first step works
        with pytest.raises(AttributeError, match="NoneType"):
            with torch.no_grad():
                model(input_ids=ids)


@pytest.mark.skipif(
    not bnb.functional.has_avx512bf16(), reason="bitsandbytes repacks 4-bit weights only on AVX512-BF16 CPUs"
)
def test_eval_forward_leaves_4bit_weights_alone(tiny_llama_dir):
    """Without ditty's `keep_4bit_layout_fixed`, bitsandbytes rewrites the 4-bit weights (scales
    rounded to bf16) at the first eval-mode forward; with it, eval and train forwards agree and the
    weights stay as loaded."""
    from transformers import AutoModelForCausalLM

    ids = batch()
    model = build_model(ModelConfig(path=tiny_llama_dir), quant=QuantConfig(kind="bnb-4bit"))
    before = frozen_base_snapshot(model)
    model.train()
    with torch.no_grad():
        train_mode = model(input_ids=ids).logits
    eval_mode = logits(model, ids)
    assert all(torch.equal(before[name], tensor) for name, tensor in frozen_base_snapshot(model).items())
    torch.testing.assert_close(eval_mode, train_mode, rtol=0, atol=1e-6)

    # What bitsandbytes does when left alone: the packed weight and its scales change.
    raw = AutoModelForCausalLM.from_pretrained(
        tiny_llama_dir, quantization_config=bnb_config(QuantConfig(kind="bnb-4bit"))
    )
    q_proj = raw.model.layers[0].self_attn.q_proj
    logits(raw, ids)
    assert q_proj.weight.quant_state.packing_format_for_cpu
    assert q_proj.weight.quant_state.absmax.dtype == torch.bfloat16


@pytest.mark.parametrize("upcast", [True, False])
def test_prepare_quantized_freezes_and_upcasts_only_when_asked(tiny_llama_dir, upcast):
    model = build_model(
        ModelConfig(path=tiny_llama_dir, dtype="bfloat16"), quant=QuantConfig(kind="bnb-4bit", compute_dtype="bfloat16")
    )
    assert model.model.norm.weight.dtype == torch.bfloat16
    prepare_quantized_for_training(model, upcast_to_fp32=upcast)
    assert not any(p.requires_grad for p in model.parameters())
    expected = torch.float32 if upcast else torch.bfloat16
    assert model.model.norm.weight.dtype == expected
    assert model.model.embed_tokens.weight.dtype == expected
    assert not model.is_gradient_checkpointing
