"""The planner's tensor inventory against transformers' own models (built on the meta device), the
table of known public configs against their published parameter counts, and the defaults the
planner assumes against transformers' config classes."""

from __future__ import annotations

import pytest

from ditty.plan.architecture import CONFIG_DEFAULTS, FAMILIES, ModelShape, inventory_from_module
from ditty.plan.known import PUBLISHED_PARAMETERS, known_config, known_ids

TINY = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
VARIANTS = [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}),
    ("mistral", {}),
    ("qwen2", {}),
    ("qwen2", {"tie_word_embeddings": True}),
    ("qwen3", {"head_dim": 32}),
    ("gemma", {"head_dim": 32}),
    ("gemma2", {"head_dim": 32}),
    ("granite", {}),
]


def _meta_model(model_type: str, values: dict):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **values)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("model_type,extra", VARIANTS)
def test_inventory_matches_the_real_model(model_type, extra):
    values = {**TINY, **extra}
    model = _meta_model(model_type, values)
    real = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    planned = [(t.name, t.shape) for t in ModelShape.from_config({"model_type": model_type, **values}).tensors]
    assert planned == real
    # The generic inventory (any architecture, from a meta build) agrees on names, shapes and blocks.
    generic = inventory_from_module(model)
    assert [(t.name, t.shape) for t in generic.tensors] == real
    arithmetic = ModelShape.from_config({"model_type": model_type, **values})
    assert [t.block for t in generic.tensors] == [t.block for t in arithmetic.tensors]
    assert [t.kind for t in generic.tensors] == [t.kind for t in arithmetic.tensors]


def test_every_family_is_tested():
    assert {model_type for model_type, _ in VARIANTS} == set(FAMILIES)


@pytest.mark.parametrize("model_id", sorted(PUBLISHED_PARAMETERS))
def test_known_configs_give_the_published_parameter_counts(model_id):
    from decimal import Decimal

    published = Decimal(str(PUBLISHED_PARAMETERS[model_id]))
    last_digit = Decimal(1).scaleb(published.as_tuple().exponent)  # 8.03 -> 0.01
    count = Decimal(ModelShape.from_config(known_config(model_id)).parameter_count) / Decimal(10**9)
    assert abs(count - published) <= last_digit / 2  # equal once rounded as the model card rounds


def test_known_table_covers_the_issue_models():
    for model_id in (
        "meta-llama/Meta-Llama-3-8B",
        "meta-llama/Llama-3.1-8B",
        "meta-llama/Meta-Llama-3-70B",
        "meta-llama/Llama-3.1-70B",
        "meta-llama/Llama-3.2-1B",
        "meta-llama/Llama-3.2-3B",
        "mistralai/Mistral-7B-v0.1",
        "Qwen/Qwen2.5-7B",
        "google/gemma-7b",
    ):
        assert model_id in known_ids()


@pytest.mark.parametrize("model_type", sorted(CONFIG_DEFAULTS))
def test_defaults_match_transformers(model_type):
    from transformers import AutoConfig

    real = AutoConfig.for_model(model_type).to_dict()
    for key, value in CONFIG_DEFAULTS[model_type].items():
        assert real[key] == value, key


def test_byte_tokenizer_size():
    from ditty.data.tokenizer import byte_tokenizer
    from ditty.plan.source import BYTE_TOKENIZER_SIZE

    assert len(byte_tokenizer()) == BYTE_TOKENIZER_SIZE
