"""Compiler rules of the long-sequence features: where `[train] loss_chunks` applies (rule
train.loss_chunks), and which attention kernels may pack (rule data.packing). One failing recipe per
problem, and the clean recipe passes."""

from __future__ import annotations

import pytest

from ditty.config.loader import parse_recipe
from ditty.recipe import compile_recipe

BASE = """
[model]
architecture = "llama"
[train]
steps = 10
global_batch_size = 8
micro_batch_size = 4
loss_chunks = 4
"""


def found(extra: str = "", rule: str = "train.loss_chunks", world_size: int = 1) -> list:
    text = BASE + extra
    plan = compile_recipe(parse_recipe(text, source="r.toml"), world_size=world_size)
    return [(p.severity, p.key, p.message) for p in plan.problems if p.rule == rule]


def test_the_chunked_loss_on_a_causal_lm_is_clean():
    assert found() == []
    assert found('[peft]\nkind = "lora"\nmodules_to_save = ["lm_head"]\n') == []  # trainable head copy
    assert found('[parallel]\nkind = "deepspeed"\nzero_stage = 2\n', world_size=2) == []
    assert found('[parallel]\nkind = "fsdp"\n', world_size=2) == []


@pytest.mark.parametrize(
    "extra, severity, key, words",
    [
        ('[[pipeline.loss]]\nuse = "ditty.loss:MSELoss"\n', "warning", "train.loss_chunks", "replaces"),
        ('[model]\nfactory = "ditty.models.denoiser:digits_denoiser"\n', "error", "train.loss_chunks", "custom"),
        ('[peft]\nkind = "dora"\ntarget_modules = ["q_proj", "lm_head"]\n', "error", "peft.target_modules", "DoRA"),
        ('[peft]\nkind = "lora"\ndropout = 0.1\ntarget_modules = ["lm_head"]\n', "error", "peft.dropout", "dropout"),
        ('[parallel]\nkind = "deepspeed"\nzero_stage = 3\n', "error", "train.loss_chunks", "ZeRO-3"),
        ("[data]\nmax_seq_len = 8\n", "warning", "train.loss_chunks", "chunks of one token"),
    ],
)
def test_where_the_chunked_loss_does_not_apply(extra, severity, key, words):
    text = BASE.replace('[model]\narchitecture = "llama"\n', "") if "factory" in extra else BASE
    if "max_seq_len" in extra:
        text = text.replace("loss_chunks = 4", "loss_chunks = 64")
    world_size = 2 if "deepspeed" in extra else 1
    plan = compile_recipe(parse_recipe(text + extra, source="r.toml"), world_size=world_size)
    hits = [p for p in plan.problems if p.rule == "train.loss_chunks"]
    assert [(p.severity, p.key) for p in hits] == [(severity, key)], [p.format() for p in plan.problems]
    assert words in hits[0].message and hits[0].fix


def test_loss_settings_without_chunks_warn():
    text = BASE.replace("loss_chunks = 4", 'loss_backend = "chunked"')
    plan = compile_recipe(parse_recipe(text, source="r.toml"))
    hits = [p for p in plan.problems if p.rule == "train.loss_chunks"]
    assert [(p.severity, p.key) for p in hits] == [("warning", "train.loss_backend")]
    negative = compile_recipe(parse_recipe(BASE.replace("loss_chunks = 4", "loss_chunks = -1"), source="r.toml"))
    assert [p.severity for p in negative.problems if p.rule == "train.loss_chunks"] == ["error"]


@pytest.mark.parametrize("kernel", ["flash_attention_2", "flex_attention"])
def test_packing_with_flash_or_flex_kernels_is_allowed_where_isolation_is_proven(kernel):
    def packing_problems(architecture: str) -> list:
        model = f'[model]\narchitecture = "{architecture}"\nattn_implementation = "{kernel}"\n'
        text = BASE.replace('[model]\narchitecture = "llama"\n', model) + "[data]\npacking = true\n"
        return [p for p in compile_recipe(parse_recipe(text, source="r.toml")).problems if p.rule == "data.packing"]

    assert packing_problems("llama") == []
    (problem,) = packing_problems("falcon")  # isolated only by its dense mask, which these kernels do not take
    assert problem.severity == "error" and "falcon" in problem.message and "sdpa" in problem.fix
