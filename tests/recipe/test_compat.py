"""Every row of the compatibility table has a recipe that trips it, and the docs show the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from ditty.config.loader import parse_recipe
from ditty.recipe import compile_recipe
from ditty.recipe.compatibility_rules import COMPAT_RULES, compat_table_markdown

BASE = """
[model]
architecture = "llama"
[train]
steps = 10
global_batch_size = 8
micro_batch_size = 4
"""

# rule id -> (extra TOML, world size)
FAILING = {
    "compat.bnb-8bit-optimizer-fsdp": (
        '[optimizer]\nkind = "adamw8bit"\nbackend = "bnb"\n[parallel]\nkind = "fsdp"\n',
        2,
    ),
    "compat.8bit-optimizer-cpu-offload": (
        '[optimizer]\nkind = "adamw8bit"\n[parallel]\nkind = "fsdp"\ncpu_offload = true\n',
        2,
    ),
    "compat.optimizer-backend": ('[optimizer]\nkind = "sgd"\nbackend = "bnb"\n', 1),
    "compat.muon-fsdp": ('[optimizer]\nkind = "muon"\n[parallel]\nkind = "fsdp"\n', 2),
    "compat.adafactor-fsdp": ('[optimizer]\nkind = "adafactor"\n[parallel]\nkind = "hsdp"\nreplicate_size = 2\n', 4),
    "compat.deepspeed-optimizer-kind": ('[parallel]\nkind = "deepspeed"\n[optimizer]\nkind = "muon"\n', 2),
    "compat.schedulefree-scheduler": ('[optimizer]\nkind = "adamw_schedulefree"\n[scheduler]\nkind = "cosine"\n', 1),
    "compat.schedulefree-missing": ('[optimizer]\nkind = "adamw_schedulefree"\n[scheduler]\nkind = "constant"\n', 1),
    "compat.quantized-needs-adapter": ('[quant]\nkind = "bnb-4bit"\n', 1),
    "compat.quant-needs-pretrained": ('[quant]\nkind = "bnb-4bit"\n[peft]\nkind = "lora"\n', 1),
    "compat.qlora-fsdp-storage-dtype": (
        '[quant]\nkind = "bnb-4bit"\nstorage_dtype = "uint8"\n[peft]\nkind = "lora"\n[parallel]\nkind = "fsdp"\n',
        2,
    ),
    "compat.8bit-loading-fsdp": ('[quant]\nkind = "bnb-8bit"\n[peft]\nkind = "lora"\n[parallel]\nkind = "fsdp"\n', 2),
    "compat.quant-deepspeed": (
        '[quant]\nkind = "bnb-4bit"\n[peft]\nkind = "lora"\n[parallel]\nkind = "deepspeed"\n',
        2,
    ),
    "compat.merge-8bit": (
        '[quant]\nkind = "bnb-8bit"\n[peft]\nkind = "lora"\n[checkpoint]\nfinal_format = "merged"\n',
        1,
    ),
    "compat.merge-4bit-dequantized": (
        '[quant]\nkind = "bnb-4bit"\n[peft]\nkind = "lora"\n[checkpoint]\nfinal_format = "merged"\n',
        1,
    ),
    "compat.merge-needs-adapter": ('[checkpoint]\nfinal_format = "merged"\n', 1),
    "compat.dora-8bit": ('[quant]\nkind = "bnb-8bit"\n[peft]\nkind = "dora"\n', 1),
    "compat.fp8-hardware": ('[run]\ndevice = "cpu"\n[fp8]\nenabled = true\n', 1),
    "compat.fp8-without-compile": ("[fp8]\nenabled = true\n", 1),
    "compat.fp8-te-missing": ('[fp8]\nenabled = true\nbackend = "te"\n', 1),
    "compat.deepspeed-missing": ('[parallel]\nkind = "deepspeed"\n', 2),
    "compat.deepspeed-compile": ('[parallel]\nkind = "deepspeed"\n[train]\ncompile = true\n', 2),
    "compat.deepspeed-fp8": ('[parallel]\nkind = "deepspeed"\n[fp8]\nenabled = true\nemulate = true\n', 2),
    "compat.deepspeed-8bit-optimizer": ('[parallel]\nkind = "deepspeed"\n[optimizer]\nkind = "adamw8bit"\n', 2),
    "compat.fp16-weights-with-scaler": ('[model]\ndtype = "float16"\n[train]\nprecision = "fp16"\n', 1),
    "compat.wandb-missing": ("[logging]\nwandb = true\n", 1),
    "compat.liger-missing": ('[train]\nloss_chunks = 4\nloss_backend = "liger"\n', 1),
    "compat.cce-missing": ('[train]\nloss_chunks = 4\nloss_backend = "cce"\n', 1),
    "compat.cce-fp32": ('[train]\nloss_chunks = 4\nloss_backend = "cce"\nprecision = "fp32"\n', 1),
    "compat.loss-kernel-cuda": ('[run]\ndevice = "cpu"\n[train]\nloss_chunks = 4\nloss_backend = "liger"\n', 1),
}


def merge(base: str, extra: str) -> str:
    """Extra tables replace or extend the base's tables of the same name."""
    import tomli_w
    import tomllib

    data = tomllib.loads(base)
    for section, values in tomllib.loads(extra).items():
        data.setdefault(section, {}).update(values)
    return tomli_w.dumps(data)


def test_every_rule_has_a_failing_recipe():
    assert {rule.id for rule in COMPAT_RULES} == set(FAILING)


@pytest.mark.parametrize("rule", COMPAT_RULES, ids=lambda r: r.id)
def test_rule_trips_on_its_recipe_and_not_on_the_base(rule, monkeypatch):
    extra, world_size = FAILING[rule.id]
    optional = {
        "compat.deepspeed-missing": "deepspeed",
        "compat.wandb-missing": "wandb",
        "compat.liger-missing": "liger_kernel",
        "compat.cce-missing": "cut_cross_entropy",
        "compat.schedulefree-missing": "schedulefree",
    }.get(rule.id)
    if optional and _has(optional):  # installed here (the dev set-up has deepspeed): pretend it is not
        from ditty.recipe import compatibility_rules as compat

        real_missing = compat._missing
        monkeypatch.setattr(compat, "_missing", lambda module: module == optional or real_missing(module))
    plan = compile_recipe(parse_recipe(merge(BASE, extra)), world_size=world_size)
    hits = [p for p in plan.problems if p.rule == rule.id]
    assert len(hits) == 1, plan.problems
    assert hits[0].severity == rule.severity and hits[0].fix
    clean = compile_recipe(parse_recipe(BASE), world_size=1)
    assert not [p for p in clean.problems if p.rule == rule.id]


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_the_docs_show_the_table():
    page = (Path(__file__).resolve().parents[2] / "docs" / "recipes" / "compiler.md").read_text()
    assert compat_table_markdown() in page, (
        "regenerate docs/recipes/compiler.md's table: python -m ditty.recipe.compatibility_rules"
    )


def test_bnb_fsdp_check_exits_2_and_suggests_torchao(capsys):
    from ditty.cli import main

    code = main(
        [
            "check",
            "tiny_sft",
            "--parallel.kind",
            "fsdp",
            "--optimizer.kind",
            "adamw8bit",
            "--optimizer.backend",
            "bnb",
            "--nproc-per-node",
            "2",
            "--train.micro_batch_size",
            "64",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and 'optimizer.backend = "torchao"' in err


def test_cce_is_refused_in_fp32_only_where_the_weights_are_fp32_too():
    """bf16 weights without autocast put bf16 tensors into cut-cross-entropy, which it takes."""
    cce = '[train]\nloss_chunks = 4\nloss_backend = "cce"\nprecision = "fp32"\n'
    for model, refused in [('[model]\ndtype = "bfloat16"\n', False), ('[model]\ndtype = "float32"\n', True)]:
        plan = compile_recipe(parse_recipe(merge(merge(BASE, cce), model)), world_size=1)
        assert any(p.rule == "compat.cce-fp32" for p in plan.problems) == refused, (model, plan.problems)
