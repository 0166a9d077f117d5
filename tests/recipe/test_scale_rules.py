"""Tensor and context parallel in the compiler: every row of the support table trips on a recipe
(exit code 2 with its fix through `ditty check`), docs/scale/parallel.md shows the table, and the degrees must
divide the model's sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ditty.config.loader import parse_recipe
from ditty.recipe import compile_recipe
from ditty.recipe.scale_rules import BYTE_TOKENIZER_SIZE, SCALE_RULES, support_table_markdown
from tests.recipe.test_compat import merge

# A tiny Llama whose sizes every degree below divides (vocab 260: the byte tokenizer's 259 rounded up).
BASE = """
[model]
architecture = "llama"
config = { hidden_size = 64, intermediate_size = 128, num_attention_heads = 4, num_key_value_heads = 2, \
num_hidden_layers = 2, vocab_size = 260 }
[train]
steps = 10
global_batch_size = 8
micro_batch_size = 2
[data]
max_seq_len = 64
[parallel]
kind = "fsdp"
tp = 2
"""

# rule id -> (extra TOML, world size)
FAILING = {
    "scale.kind-none": ('[parallel]\nkind = "none"\n', 2),
    "scale.kind-ddp": ('[parallel]\nkind = "ddp"\n', 4),
    "scale.kind-hsdp": ('[parallel]\nkind = "hsdp"\nreplicate_size = 2\ntp = 1\ncp = 2\n', 4),
    "scale.kind-deepspeed": ('[parallel]\nkind = "deepspeed"\n', 4),
    "scale.tp-adapter": ('[peft]\nkind = "lora"\n', 4),
    "scale.tp-quantized": ('[quant]\nkind = "bnb-4bit"\n[peft]\nkind = "lora"\n', 4),
    "scale.cp-quantized": ('[quant]\nkind = "bnb-4bit"\n[peft]\nkind = "lora"\n[parallel]\ntp = 1\ncp = 2\n', 4),
    "scale.fp8": ("[fp8]\nenabled = true\nemulate = true\n", 4),
    "scale.compile": ("[train]\ncompile = true\n", 4),
    "scale.task": ('[model]\ntask = "seq-classification"\n', 4),
    "scale.model-type": ('[model]\narchitecture = "gpt2"\nconfig = {}\n', 4),
    "scale.post-training": (
        '[rl]\nkind = "grpo"\n[data]\nformat = "prompt"\n[parallel]\ntp = 1\ncp = 2\n',
        4,
    ),
    "scale.cp-pairs": (
        '[data]\nformat = "preference"\n[preference]\nkind = "dpo"\nreference = "precompute"\n'
        "[parallel]\ntp = 1\ncp = 2\n",
        4,
    ),
    "scale.tp-rollout-engine": (
        '[rl]\nkind = "grpo"\n[data]\nformat = "prompt"\n[rollout]\nbackend = "vllm-server"\n',
        4,
    ),
    "scale.pipeline-loss": ('[[pipeline.loss]]\nuse = "ditty.loss:MSELoss"\n', 4),
    "scale.tp-loss-kernel": ('[train]\nloss_chunks = 4\nloss_backend = "liger"\n', 4),
    "scale.cp-attention": ('[model]\nattn_implementation = "eager"\n[parallel]\ncp = 2\n', 8),
    "scale.cp-sliding-window": (
        '[model]\narchitecture = "mistral"\nconfig = { hidden_size = 64, intermediate_size = 128, '
        "num_attention_heads = 4, num_key_value_heads = 2, num_hidden_layers = 2, vocab_size = 260, "
        "sliding_window = 32 }\n[parallel]\ntp = 1\ncp = 2\n",
        4,
    ),
}


def test_every_row_has_a_failing_recipe():
    assert {row.id for row in SCALE_RULES} == set(FAILING)


def test_the_base_recipe_compiles_clean_on_tp_and_cp():
    for extra in ("", "[parallel]\ncp = 2\n"):
        plan = compile_recipe(parse_recipe(merge(BASE, extra)), world_size=8)
        assert not plan.errors, plan.problems
    assert plan.data_parallel_size == 2 and plan.accumulation_steps == 2


@pytest.mark.parametrize("row", SCALE_RULES, ids=lambda r: r.id)
def test_row_trips_on_its_recipe_and_not_on_the_base(row):
    extra, world_size = FAILING[row.id]
    plan = compile_recipe(parse_recipe(merge(BASE, extra)), world_size=world_size)
    hits = [p for p in plan.problems if p.rule == row.id]
    assert len(hits) == 1, plan.problems
    assert hits[0].severity == "error" and hits[0].fix == row.fix
    clean = compile_recipe(parse_recipe(BASE), world_size=4)
    assert not [p for p in clean.problems if p.rule == row.id]


@pytest.mark.parametrize("row", SCALE_RULES, ids=lambda r: r.id)
def test_ditty_check_exits_2_with_the_fix(row, tmp_path, capsys):
    from ditty.cli import main

    extra, world_size = FAILING[row.id]
    path = tmp_path / "recipe.toml"
    path.write_text(merge(BASE, extra))
    code = main(["check", str(path), "--nproc-per-node", str(world_size)])
    err = capsys.readouterr().err
    assert code == 2
    assert row.fix in " ".join(err.split()), err  # the message wraps nothing, but be safe about spacing


def test_readme_shows_the_support_table():
    page = (Path(__file__).resolve().parents[2] / "docs" / "scale" / "parallel.md").read_text()
    assert support_table_markdown() in page, (
        "regenerate the table in docs/scale/parallel.md: python -m ditty.recipe.scale_rules"
    )


def test_the_byte_tokenizer_size_is_what_the_rules_assume():
    from ditty.data.tokenizer import byte_tokenizer

    assert len(byte_tokenizer()) == BYTE_TOKENIZER_SIZE


# ------------------------------------------------------------------ what must divide what


def _errors(extra: str, world: int) -> dict[str, str]:
    plan = compile_recipe(parse_recipe(merge(BASE, extra)), world_size=world)
    return {p.key: f"{p.message} | {p.fix}" for p in plan.errors}


def test_tp_must_divide_heads_kv_heads_and_mlp_width_not_the_vocabulary():
    config = (
        "[model]\nconfig = { hidden_size = 48, intermediate_size = 102, num_attention_heads = 6, "
        "num_key_value_heads = 3, num_hidden_layers = 2, vocab_size = 259 }\n[parallel]\ntp = 4\n"
    )
    plan = compile_recipe(parse_recipe(merge(BASE, config)), world_size=4)
    messages = [p.message for p in plan.errors]
    assert any("attention heads (6)" in m for m in messages)
    assert any("key/value heads (3)" in m for m in messages)
    assert any("intermediate (MLP) size (102)" in m for m in messages)
    # 259 tokens over 4 ranks: 65, 65, 65 and 64 rows (uneven shards, nothing padded)
    assert not any("vocabulary" in m for m in messages), messages
    # The hidden size (48) is never split: sequence parallel cuts the norms along the sequence.
    assert not any("hidden" in m for m in messages)


def test_random_init_with_the_byte_tokenizer_runs_at_any_tp():
    for kv_heads, tp in ((2, 2), (4, 4)):  # 259 tokens: 130/129 rows at tp = 2, 65/65/65/64 at tp = 4
        config = (
            "[model]\nconfig = { hidden_size = 64, intermediate_size = 128, num_attention_heads = 4, "
            f"num_key_value_heads = {kv_heads}, num_hidden_layers = 2 }}\n[parallel]\ntp = {tp}\n"
        )
        assert _errors(config, 4) == {}


def test_tied_embeddings_compile_under_tp():
    config = (
        "[model]\nconfig = { hidden_size = 64, intermediate_size = 128, num_attention_heads = 4, "
        "num_key_value_heads = 2, num_hidden_layers = 2, tie_word_embeddings = true }\n"
    )
    assert _errors(config, 4) == {}


def test_a_pretrained_vocabulary_runs_at_a_tp_that_does_not_divide_it(tmp_path):
    from tests.conftest import _save_tiny

    path = _save_tiny(tmp_path / "odd", "llama", vocab_size=262, num_key_value_heads=4)
    recipe = f'[model]\npath = "{path}"\n[tokenizer]\nkind = "byte"\n[parallel]\nkind = "fsdp"\ntp = 4\n'
    plan = compile_recipe(parse_recipe(recipe), world_size=4)
    assert not [p for p in plan.errors if p.rule == "scale.sizes"], plan.errors


def test_a_tp_that_leaves_a_rank_no_vocabulary_row_is_refused():
    config = (
        "[model]\nconfig = { hidden_size = 64, intermediate_size = 128, num_attention_heads = 8, "
        "num_key_value_heads = 8, num_hidden_layers = 2, vocab_size = 13 }\n[parallel]\ntp = 8\n"
    )
    errors = _errors(config, 8)
    assert "leaves a rank without a row of the vocabulary (13 tokens" in errors["parallel.tp"]
    assert "2, 2, 2, 2, 2, 2, 1, 0 rows" in errors["parallel.tp"] and "choose tp at most 7" in errors["parallel.tp"]


def test_cp_must_divide_the_heads_with_tp_and_the_rows():
    errors = _errors("[data]\nmax_seq_len = 66\n[parallel]\ncp = 4\n", 8)
    assert "tp x cp = 8 does not divide the model's 4 attention heads" in errors["parallel.cp"]
    assert "= 66 is not a multiple of cp = 4" in errors["data.max_seq_len"]
    assert "max_seq_len = 68" in errors["data.max_seq_len"]


def test_world_size_must_be_a_multiple_of_tp_times_cp():
    errors = _errors("[parallel]\ncp = 2\n", 6)
    assert "tp x cp = 2 x 2 = 4 does not divide the world size 6" in errors["parallel.tp"]
    one = _errors("", 1)  # `ditty check` without --nproc-per-node: one process cannot hold tp = 2
    assert "does not divide the world size 1" in one["parallel.tp"]


def test_a_checkpoint_resumes_on_another_mesh_without_force_resume():
    from ditty.checkpoint.resume_diff import recipe_differences

    saved = {"parallel.tp": 2, "parallel.cp": 1, "parallel.kind": "fsdp", "optimizer.lr": 0.001}
    moved = {"parallel.tp": 1, "parallel.cp": 4, "parallel.kind": "none", "optimizer.lr": 0.001}
    assert recipe_differences(saved, moved, step=2) == []  # the layout, not the training
    assert recipe_differences(saved, {**moved, "optimizer.lr": 0.002}, step=2)  # a real change still counts
