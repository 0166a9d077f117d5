"""build_model: pretrained from a local directory, random init with overrides, dtypes, factories,
and the user errors each path can hit (all RecipeErrors naming the key)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ditty.config.errors import RecipeError
from ditty.config.sections import ModelConfig
from ditty.data.tokenizer import byte_tokenizer
from ditty.models import build_model

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def test_pretrained_from_local_dir_matches_transformers(tiny_llama_dir):
    model = build_model(ModelConfig(path=tiny_llama_dir))
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    ids = torch.randint(3, 259, (2, 9))
    assert model.dtype == torch.float32
    assert torch.equal(_logits(model, ids), _logits(reference, ids))


def test_random_init_applies_overrides_and_tokenizer(tokenizer):
    model = build_model(ModelConfig(init="random", architecture="llama", config=TINY), tokenizer=tokenizer)
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (32, 3, 2)
    assert config.head_dim == 8  # derived in the constructor: overrides are not set afterwards
    assert len(model.model.layers) == 3
    assert model.get_input_embeddings().weight.shape == (len(tokenizer), 32)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
    )


def test_random_init_from_a_path_takes_its_architecture(tiny_llama_dir, tokenizer):
    model = build_model(
        ModelConfig(path=tiny_llama_dir, init="random", config={"num_hidden_layers": 1}), tokenizer=tokenizer
    )
    pretrained = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    assert model.config.num_hidden_layers == 1
    assert model.config.hidden_size == pretrained.config.hidden_size
    assert not torch.equal(model.model.embed_tokens.weight, pretrained.model.embed_tokens.weight)


def test_random_init_uses_the_callers_seed(tokenizer):
    config = ModelConfig(init="random", architecture="llama", config=TINY)
    torch.manual_seed(3)
    first = build_model(config, tokenizer=tokenizer)
    torch.manual_seed(3)
    second = build_model(config, tokenizer=tokenizer)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))


def test_explicit_vocab_size_wins_but_must_fit_the_tokenizer(tokenizer):
    padded = build_model(
        ModelConfig(init="random", architecture="llama", config={**TINY, "vocab_size": 320}), tokenizer=tokenizer
    )
    assert padded.config.vocab_size == 320
    with pytest.raises(RecipeError) as error:
        build_model(
            ModelConfig(init="random", architecture="llama", config={**TINY, "vocab_size": 100}), tokenizer=tokenizer
        )
    assert error.value.problems[0].key == "model.config.vocab_size"


def test_unknown_override_key_names_a_close_match():
    with pytest.raises(RecipeError) as error:
        build_model(ModelConfig(init="random", architecture="llama", config={"hiden_size": 32}))
    problem = error.value.problems[0]
    assert problem.key == "model.config.hiden_size"
    assert '"hidden_size"' in problem.fix


def test_rope_keys_of_a_transformers_4_config_json_are_taken(tokenizer):
    """rope_theta and rope_scaling (in every Llama-3 config.json) are folded into rope_parameters by
    transformers 5: real keys, not misspellings. A misspelled one is still refused."""
    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    config = dict(TINY, max_position_embeddings=256, rope_theta=500000.0)
    model = build_model(
        ModelConfig(init="random", architecture="llama", config=config), tokenizer=tokenizer, device="cpu"
    )
    assert model.config.rope_parameters["rope_theta"] == 500000.0
    scaled = dict(config, rope_scaling={**scaling, "original_max_position_embeddings": 128})
    model = build_model(ModelConfig(init="random", architecture="llama", config=scaled), tokenizer=tokenizer)
    assert model.config.rope_parameters["rope_type"] == "llama3" and model.config.rope_parameters["factor"] == 8.0
    with pytest.raises(RecipeError) as error:
        build_model(ModelConfig(init="random", architecture="llama", config={"rope_thetta": 1e6}))
    assert error.value.problems[0].key == "model.config.rope_thetta"


def test_inconsistent_override_values_are_a_recipe_error():
    with pytest.raises(RecipeError) as error:
        build_model(
            ModelConfig(init="random", architecture="llama", config={"hidden_size": 30, "num_attention_heads": 4})
        )
    assert error.value.problems[0].key == "model.config"
    assert "not a multiple" in error.value.problems[0].message


def test_unknown_architecture_names_a_close_match():
    with pytest.raises(RecipeError) as error:
        build_model(ModelConfig(init="random", architecture="lama"))
    assert error.value.problems[0].key == "model.architecture"
    assert '"llama"' in error.value.problems[0].fix


@pytest.mark.parametrize("path", ["./no/such/model", "/no/such/model", "~/no/such/dir"])
def test_missing_local_path_is_a_recipe_error(path):
    with pytest.raises(RecipeError) as error:
        build_model(ModelConfig(path=path))
    assert error.value.problems[0].key == "model.path"
    assert "does not exist" in error.value.problems[0].message


def test_an_invalid_hub_id_is_a_recipe_error():
    with pytest.raises(RecipeError, match="neither a local directory nor a valid hub id"):
        build_model(ModelConfig(path="my model"))


def test_directory_without_config_is_a_recipe_error(tmp_path):
    with pytest.raises(RecipeError, match="no config.json"):
        build_model(ModelConfig(path=str(tmp_path)))


def test_offline_hub_id_is_a_recipe_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(RecipeError) as error:
        build_model(ModelConfig(path="ditty-tests/no-such-model"))
    problem = error.value.problems[0]
    assert problem.key == "model.path"
    assert "could not be fetched" in problem.message
    assert "local directory" in problem.fix


def test_auto_dtype_is_float32_on_cpu_and_explicit_dtypes_apply(tmp_path, tiny_llama_dir):
    AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.bfloat16).save_pretrained(tmp_path)
    assert build_model(ModelConfig(path=str(tmp_path))).dtype == torch.float32
    assert build_model(ModelConfig(path=tiny_llama_dir, dtype="bfloat16")).dtype == torch.bfloat16
    random = build_model(ModelConfig(init="random", architecture="llama", config=TINY, dtype="float16"))
    assert random.dtype == torch.float16


def test_attention_implementation_is_passed_on(tiny_llama_dir):
    model = build_model(ModelConfig(path=tiny_llama_dir, attn_implementation="eager"))
    assert model.config._attn_implementation == "eager"


def test_pretrained_embeddings_grow_for_a_larger_tokenizer(tiny_llama_dir):
    tokenizer = byte_tokenizer()
    tokenizer.add_tokens(["<extra>"])
    model = build_model(ModelConfig(path=tiny_llama_dir), tokenizer=tokenizer)
    assert model.get_input_embeddings().num_embeddings == len(tokenizer) == 260


def test_factory_builds_a_custom_model():
    model = build_model(
        ModelConfig(factory="tests.models.factories:tiny_mlp", factory_kwargs={"width": 4}, dtype="float16")
    )
    assert isinstance(model, torch.nn.Sequential)
    assert model[0].weight.shape == (4, 4) and model[0].weight.dtype == torch.float16


@pytest.mark.parametrize(
    ("factory", "kwargs", "key", "text"),
    [
        ("tests.models.factories", {}, "model.factory", "package.module:Name"),
        ("tests.models.no_such_module:build", {}, "model.factory", "cannot import"),
        ("tests.models.factories:missing", {}, "model.factory", "has no attribute 'missing'"),
        ("tests.models.factories:not_a_module", {}, "model.factory", "not a torch.nn.Module"),
        ("tests.models.factories:tiny_mlp", {"wdth": 4}, "model.factory_kwargs", "does not accept"),
    ],
)
def test_factory_mistakes_are_recipe_errors(factory, kwargs, key, text):
    with pytest.raises(RecipeError) as error:
        build_model(ModelConfig(factory=factory, factory_kwargs=kwargs))
    assert error.value.problems[0].key == key
    assert text in error.value.problems[0].message


def test_an_architecture_without_a_causal_lm_head_is_a_recipe_error():
    with pytest.raises(RecipeError, match="cannot build a causal LM") as error:
        build_model(ModelConfig(init="random", architecture="vit"))
    assert error.value.problems[0].key == "model.architecture"


def test_pretrained_init_needs_a_path():
    with pytest.raises(RecipeError) as error:
        build_model(ModelConfig(init="pretrained", architecture="llama"))
    assert error.value.problems[0].key == "model.path"


def test_auto_init_loads_a_path_and_builds_an_architecture(tiny_llama_dir):
    pretrained = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    loaded = build_model(ModelConfig(path=tiny_llama_dir))  # init = "auto" with a path: pretrained
    assert torch.equal(loaded.model.embed_tokens.weight, pretrained.model.embed_tokens.weight)
    assert build_model(ModelConfig(architecture="llama", config=TINY)).config.hidden_size == 32
