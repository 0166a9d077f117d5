"""The memory plan of `[mtp]` heads (ditty/plan/mtp.py): their parameters are the real heads' tensor for
tensor (trained in full beside an adapter), and their activations are what autograd saves running them."""

from __future__ import annotations

import pytest
import torch

from ditty.config.loader import parse_recipe
from ditty.models.mtp.heads import heads_of, run_depths
from ditty.plan.activations import plan_activations
from ditty.plan.memory import plan_memory
from ditty.plan.mtp import heads_activation_bytes
from ditty.plan.parameters import held_tensors
from ditty.plan.settings import Settings, Target
from ditty.plan.source import model_shape
from tests.models.mtp_helpers import BASE, tiny_model

SEQ = 64
RECIPE = f"""
[model]
architecture = "llama"
config = {{ {", ".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in BASE.items())} }}
[data]
source = "builtin"
name = "addition"
format = "prompt_completion"
max_seq_len = {SEQ}
[train]
steps = 10
global_batch_size = 1
micro_batch_size = 1
precision = "fp32"
[mtp]
depth = 2
"""


def planned(extra: str = ""):
    config = parse_recipe(RECIPE + extra).config
    shape = model_shape(config)
    settings = Settings.resolve(config, shape, Target(device="cpu"))
    return shape, settings, held_tensors(shape, settings)


@pytest.mark.parametrize("peft", ["", '[peft]\nkind = "lora"\ntarget_modules = ["q_proj", "v_proj"]\n'])
def test_the_heads_parameters_are_the_real_heads(peft):
    _, _, held = planned(peft)
    heads = {t.name: t for t in held if t.group == "MTP heads"}
    real = dict(heads_of(tiny_model("llama", depth=2)).named_parameters())
    assert {name.removeprefix("ditty_mtp.") for name in heads} == set(real)
    assert all(heads[f"ditty_mtp.{name}"].numel == p.numel() for name, p in real.items())
    assert all(t.trainable for t in heads.values())  # in full, beside the adapter
    assert not any("ditty_mtp" in t.name for t in held if t.group == "LoRA adapters")


def test_the_heads_activations_are_what_autograd_saves_running_them():
    shape, settings, held = planned()
    activations = plan_activations(shape, settings, held)
    expected = heads_activation_bytes(shape, activations.kept_per_block, activations.tokens, 4)
    rows = {row.label: row.bytes for row in plan_memory(shape, settings).kinds[0].rows}
    assert rows["MTP heads' activations (2 blocks)"] == expected

    model = tiny_model("llama", depth=2).train()
    model(input_ids=torch.randint(3, 60, (1, SEQ)), use_cache=False)
    trunk = heads_of(model).capture.take()
    # the trunk's outputs are the trunk's to keep: the heads' own saved tensors only
    trunk.hidden = trunk.hidden.detach().requires_grad_(True)
    trunk.embeddings = trunk.embeddings.detach().requires_grad_(True)
    saved: dict[int, int] = {}
    skip = {p.data_ptr() for p in model.parameters()} | {trunk.hidden.data_ptr(), trunk.embeddings.data_ptr()}

    def keep(tensor):
        if tensor.data_ptr() not in skip:
            saved[tensor.data_ptr()] = max(saved.get(tensor.data_ptr(), 0), tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        run_depths(heads_of(model), trunk)
    assert sum(saved.values()) == expected
