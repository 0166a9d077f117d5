"""The compiler's `[mtp]` rules (ditty/recipe/mtp_rules.py): heads on a verified causal LM trained by
SFT or GKD compile clean; everywhere they cannot apply is an error on `mtp.depth` with a fix; bad values
are errors on their own keys; settings without heads are warnings."""

from __future__ import annotations

import pytest

from ditty.config.loader import parse_recipe
from ditty.recipe import compile_recipe

BASE = """
[model]
architecture = "llama"
[data]
source = "builtin"
name = "addition"
format = "prompt_completion"
max_seq_len = 32
[train]
steps = 10
global_batch_size = 8
micro_batch_size = 4
"""


def found(extra: str = "", world_size: int = 1) -> list:
    plan = compile_recipe(parse_recipe(BASE + extra, source="r.toml"), world_size=world_size)
    return [(p.severity, p.key, p.message) for p in plan.problems if p.rule.startswith("mtp.")]


@pytest.mark.parametrize(
    "recipe, world_size",
    [
        (BASE, 1),
        (BASE.replace("max_seq_len = 32", "max_seq_len = 32\npacking = true"), 1),
        (BASE + '[parallel]\nkind = "fsdp"\n', 2),
        (BASE + '[parallel]\nkind = "ddp"\n', 2),
        (BASE + '[peft]\nkind = "lora"\n', 1),
        (BASE.replace('architecture = "llama"', 'architecture = "deepseek_v3"'), 1),
    ],
)
def test_heads_where_they_apply_compile_clean(recipe, world_size):
    plan = compile_recipe(parse_recipe(recipe + "[mtp]\ndepth = 2\n", source="r.toml"), world_size=world_size)
    assert [p for p in plan.problems if p.rule.startswith("mtp.")] == []


@pytest.mark.parametrize(
    "recipe, world_size, words",
    [
        (BASE.replace('architecture = "llama"', 'architecture = "bert"\ntask = "masked-lm"'), 1, "causal LM"),
        (BASE.replace('architecture = "llama"', 'architecture = "gpt2"'), 1, 'not "gpt2"'),
        (BASE.replace('architecture = "llama"', 'factory = "tests.models.factories:tiny_mlp"'), 1, "model.factory"),
        (BASE + '[[pipeline.loss]]\nuse = "ditty.loss:CausalLMLoss"\n', 1, "[[pipeline.loss]] replaces"),
        (BASE + '[parallel]\nkind = "deepspeed"\n', 2, "DeepSpeed"),
        (BASE + '[parallel]\nkind = "fsdp"\ntp = 2\n', 2, "tensor or context parallel"),
        (
            BASE + '[rl]\nkind = "grpo"\nrewards = ["ditty.objectives.rewards.builtin_rewards:exact_match"]\n',
            1,
            '"grpo"',
        ),
    ],
)
def test_heads_where_they_cannot_apply_are_an_error_on_mtp_depth(recipe, world_size, words):
    plan = compile_recipe(parse_recipe(recipe + "[mtp]\ndepth = 1\n", source="r.toml"), world_size=world_size)
    errors = [p for p in plan.problems if p.rule == "mtp.applies" and p.severity == "error"]
    assert errors and all(p.key == "mtp.depth" and p.fix for p in errors)
    assert any(words in p.message for p in errors), [p.message for p in errors]


@pytest.mark.parametrize(
    "extra, key",
    [
        ("[mtp]\ndepth = -1\n", "mtp.depth"),
        ("[mtp]\ndepth = 1\nweight = -0.5\n", "mtp.weight"),
        ("[mtp]\ndepth = 1\ndecay = 0.0\n", "mtp.decay"),
        ("[mtp]\ndepth = 40\n", "mtp.depth"),
    ],
)
def test_bad_values_are_errors_on_their_keys(extra, key):
    assert ("error", key) in [(severity, k) for severity, k, _ in found(extra)]


def test_settings_without_heads_and_heads_without_weight_are_warnings():
    assert found("[mtp]\nweight = 0.3\n") == [
        ("warning", "mtp.weight", "has no effect with mtp.depth = 0 (no MTP heads)")
    ]
    assert [(s, k) for s, k, _ in found("[mtp]\ndepth = 1\nweight = 0.0\n")] == [("warning", "mtp.weight")]


def test_a_stage_without_heads_warns_that_it_drops_the_saved_ones(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "mtp.safetensors").write_bytes(b"")
    text = BASE.replace('architecture = "llama"', f'path = "{tmp_path}"')
    plan = compile_recipe(parse_recipe(text, source="r.toml"))
    warned = [p for p in plan.problems if p.rule == "mtp.applies"]
    assert [(p.severity, p.key) for p in warned] == [("warning", "mtp.depth")]
    assert "mtp.safetensors" in warned[0].message
