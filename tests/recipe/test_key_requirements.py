"""What the recipe reference says a key needs (ditty.recipe.key_requirements) is what the compiler
checks: each requirement, broken by a bundled recipe and a few flags, makes `ditty check` name its
key (exit 2 for an error, a warning otherwise); and every requirement's key is a field of a recipe."""

from __future__ import annotations

import pytest

from ditty.config.root import TrainerConfig
from ditty.config.schema import walk_leaves
from ditty.recipe.key_requirements import REQUIREMENTS

# key -> (recipe, flags that break the requirement, the key `ditty check` reports, its exit code)
BROKEN = {
    "rollout.max_staleness": ("tiny_grpo", ["--rollout.max_staleness", "1"], "rollout.max_staleness", 2),
    "rollout.sampler_correction": (
        "tiny_grpo",
        ["--rollout.sampler_correction", "tis"],
        "rollout.sampler_correction",
        2,
    ),
    "rollout.backend": ("tiny_grpo", ["--rollout.backend", "vllm-server", "--peft.kind", "dora"], "peft.kind", 2),
    "rollout.vllm_server": (
        "tiny_grpo",
        ["--rollout.backend", "vllm-server", "--rollout.vllm_server", "localhost:8000"],
        "rollout.vllm_server",
        2,
    ),
    "rl.group_size": ("tiny_grpo", ["--rl.group_size", "3"], "train.global_batch_size", 2),
    "rl.guidance_column": ("tiny_grpo", ["--rl.guidance_column", "answer"], "rl.guidance_column", 2),
    "rl.credit": ("tiny_tools", ["--rl.credit", "turn", "--rl.importance", "sequence"], "rl.credit", 2),
    "rl.kind": ("tiny_grpo", ["--data.format", "prompt_completion"], "data.format", 2),
    "rl.tools": (
        "tiny_tools",
        ["--rl.tools", '["tests.rl.environments_for_tests:echo", "tests.rl.environments_for_tests:echo"]'],
        "rl.tools[1]",
        2,
    ),
    "preference.pairs": ("tiny_dpo", ["--preference.pairs", "online", "--data.format", "prompt"], "rl.rewards", 2),
    "preference.kind": ("tiny_dpo", ["--preference.kind", "kto"], "data.format", 2),
    "preference.reference": (
        "tiny_dpo", ["--preference.kind", "simpo", "--preference.reference", "auto"], "preference.reference", 2
    ),
    # exit 2 for the reference tiny_dpo names, which ORPO refuses; the warning is the one asked for
    "preference.sft_weight": ("tiny_dpo", ["--preference.kind", "orpo"], "preference.sft_weight", 2),
    "distill.lmbda": ("tiny_distill", ["--data.packing", "true"], "data.packing", 2),
    "distill.teacher": ("tiny_distill", ["--distill.teacher", "no/such/teacher"], "distill.teacher", 2),
    "mtp.depth": ("tiny_dpo", ["--mtp.depth", "1"], "mtp.depth", 2),
    "train.stop_when": ("tiny_sft", ["--train.stop_when", "loss < 1"], "train.stop_when", 2),
    "model.task": ("tiny_reward", ["--data.packing", "true"], "data.packing", 2),
}  # fmt: skip
STARTS_FROM_A_MODEL = {"tiny_grpo", "tiny_dpo", "tiny_tools", "tiny_reward"}


def test_every_requirement_is_about_a_recipe_key_and_is_tripped_below():
    keys = {info.path for info in walk_leaves(TrainerConfig)}
    for requirement in REQUIREMENTS:
        assert requirement.key in keys, requirement.key
        assert requirement.text.endswith(".") and requirement.key in BROKEN, requirement
    assert len({r.key for r in REQUIREMENTS}) == len(REQUIREMENTS)


@pytest.mark.parametrize("key", sorted(BROKEN))
def test_breaking_a_requirement_makes_check_name_the_key(key, tiny_llama_dir, capsys):
    from ditty.cli import main

    recipe, flags, reported, code = BROKEN[key]
    if recipe in STARTS_FROM_A_MODEL:
        flags = ["--model.path", tiny_llama_dir, *flags]
    if recipe == "tiny_distill" and key != "distill.teacher":
        flags = ["--distill.teacher", tiny_llama_dir, *flags]
    assert main(["check", recipe, *flags]) == code
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert f"`{reported}`" in said or f"{reported}:" in said, said[-2000:]
