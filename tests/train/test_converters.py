"""`model.converters`: the order of model rewrites, user converters, and the compiler's checks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ditty.config.loader import parse_recipe
from ditty.recipe import compile_recipe
from tests.train.test_distributed import tiny_config

BASE = """
[model]
architecture = "llama"
{converters}
[train]
steps = 10
global_batch_size = 8
micro_batch_size = 4
"""


def problems(converters: str, extra: str = "") -> list:
    plan = compile_recipe(parse_recipe(BASE.format(converters=converters) + extra), world_size=1)
    return [p for p in plan.problems if p.key == "model.converters"]


def test_listed_converters_in_any_order_pass():
    extra = '[peft]\nkind = "lora"\n[fp8]\nenabled = true\nemulate = true\n'
    assert problems('converters = ["fp8", "peft"]', extra) == []
    assert problems('converters = ["peft", "fp8", "tests.train.converter_hooks:FreezeEmbeddings"]', extra) == []
    assert problems("", extra) == []  # empty: the default order


@pytest.mark.parametrize(
    "converters, extra, message",
    [
        ('converters = ["peft"]', "", "lists 'peft' but peft.kind leaves the [peft] adapter off"),
        ('converters = ["fp8"]', '[peft]\nkind = "lora"\n', "does not list 'peft'"),
        ('converters = ["peft", "peft"]', '[peft]\nkind = "lora"\n', "lists 'peft' twice"),
        ('converters = ["float8"]', "", "neither a built-in converter"),
        ('converters = ["tests.train.converter_hooks:NotAConverter"]', "", "is not a converter class"),
        ('converters = ["tests.train.nowhere:Thing"]', "", "cannot import module"),
    ],
)
def test_bad_converter_lists_are_recipe_errors(converters, extra, message):
    found = problems(converters, extra)
    assert any(message in p.message for p in found) and all(p.fix for p in found)


def test_a_user_converter_rewrites_the_model_and_gets_the_optimizer_hook(tmp_path):
    from ditty.train import Trainer

    config = tiny_config(str(tmp_path / "run"), micro=4, steps=3)
    config = replace(config, model=replace(config.model, converters=["tests.train.converter_hooks:FreezeEmbeddings"]))
    trainer = Trainer(config)
    before = trainer.model.get_input_embeddings().weight.detach().clone()
    trainer.train()
    [converter] = trainer.converters
    assert type(converter).__name__ == "FreezeEmbeddings" and converter.steps == 3
    assert torch.equal(trainer.model.get_input_embeddings().weight, before)  # frozen, so never stepped
    trained = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert id(trainer.model.get_input_embeddings().weight) not in trained
