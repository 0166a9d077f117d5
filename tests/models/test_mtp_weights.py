"""The MTP heads in final/ (ditty.models.mtp.weights): beside a model that transformers loads exactly as
before, in `mtp.safetensors` (or, for DeepSeek-V3 and GLM-4.5, under their own checkpoint names inside
the weights), read back by the converter of a later stage; adapters and merged models keep them too."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from ditty.models.mtp.converter import MTPConverter
from ditty.models.mtp.heads import heads_of
from ditty.models.mtp.weights import MTP_FILE, depth_saved
from ditty.train.final import save_final
from tests.models.mtp_helpers import tiny_model


def heads_state(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in heads_of(model).state_dict().items()}


def load_plain(directory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)


def test_final_loads_with_transformers_as_before_and_holds_the_heads(tmp_path):
    model = tiny_model("llama", depth=2)
    final = save_final(model, None, str(tmp_path))
    loaded, info = load_plain(final)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    trunk = {k: v for k, v in model.state_dict().items() if not k.startswith("ditty_mtp.")}
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in trunk.items())
    saved = load_file(f"{final}/{MTP_FILE}")
    assert sorted(saved) == sorted(f"mtp.{k}" for k in heads_state(model))
    assert depth_saved(final) == 2
    assert "mtp.layers.1.mtp_block.self_attn.q_proj.weight" in saved
    manifest = json.loads(open(f"{final}/manifest.json").read())
    assert MTP_FILE in json.dumps(manifest)  # verified with the model before generate or push read it

    # a later stage's converter reads them back; a deeper head than saved starts fresh
    again = MTPConverter(3, source_dir=final).convert(loaded)
    got, expected = heads_state(again), heads_state(model)
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    assert any(k.startswith("layers.2.") for k in got)
    assert heads_of(model).state_dict().keys() == {k for k in got if not k.startswith("layers.2.")}


@pytest.mark.parametrize("model_type", ["deepseek_v3", "glm4_moe"])
def test_architectures_that_ship_mtp_layers_keep_them_under_their_own_names(tmp_path, model_type):
    model = tiny_model(model_type, depth=2)
    final = save_final(model, None, str(tmp_path))
    index = json.loads(open(f"{final}/model.safetensors.index.json").read())["weight_map"]
    first = model.config.num_hidden_layers
    for depth in range(2):
        layer = f"model.layers.{first + depth}"
        for name in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"):
            assert f"{layer}.{name}" in index
        # the block in the checkpoint format: one tensor per routed expert, as the hub's files hold them
        assert f"{layer}.mlp.experts.0.gate_proj.weight" in index
        assert f"{layer}.self_attn.o_proj.weight" in index
    assert not any("ditty_mtp" in k or k.startswith("mtp.") for k in index)
    config = json.loads(open(f"{final}/config.json").read())
    assert config["num_nextn_predict_layers"] == 2
    assert depth_saved(final) == 2

    loaded, info = load_plain(final)
    assert not info["missing_keys"]
    assert all(k.startswith((f"model.layers.{first}.", f"model.layers.{first + 1}.")) for k in info["unexpected_keys"])
    again = MTPConverter(2, source_dir=final).convert(loaded)
    got, expected = heads_state(again), heads_state(model)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], v) for k, v in expected.items())


def test_an_adapter_run_keeps_its_heads_beside_the_adapter_and_in_the_merged_model(tmp_path):
    from ditty.config.sections import PeftConfig
    from ditty.models.adapters import LoraConverter
    from ditty.models.mtp.converter import MTPConverter

    base = tiny_model("llama", depth=0)
    adapted = LoraConverter(PeftConfig(kind="lora", r=4, target_modules=["q_proj", "v_proj"])).convert(base)
    model = MTPConverter(2).convert(adapted)
    heads = heads_of(model)
    assert all(p.requires_grad for p in heads.parameters())  # trained in full beside the adapter
    assert not any("lora" in n for n, _ in heads.named_parameters())
    final = save_final(model, None, str(tmp_path), merged=True)
    assert depth_saved(final) == 2 and depth_saved(f"{final}/merged") == 2
    expected = heads_state(model)
    for directory in (final, f"{final}/merged"):
        saved = {k.removeprefix("mtp."): v for k, v in load_file(f"{directory}/{MTP_FILE}").items()}
        assert all(torch.equal(saved[k], v) for k, v in expected.items())
    merged, info = load_plain(f"{final}/merged")
    assert not info["missing_keys"] and not info["unexpected_keys"]
