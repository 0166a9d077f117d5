"""What a key needs of the other keys, in words, for the keys whose rules are not rows of the
compatibility or tensor/context-parallel tables (those tables carry their own words).

The recipe reference shows each sentence in the key's row (ditty.recipe.reference_tables), so a user
reads "needs a vLLM backend" beside `rollout.max_staleness` before `ditty check` has to say it. Each
entry restates a rule the compiler checks; tests/recipe/test_key_requirements.py trips every one
with a recipe and expects `ditty check` to name the key.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Requirement:
    key: str
    """The dotted key the sentence is shown beside (and `ditty check` reports on)."""
    text: str
    """One sentence."""


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(
        "rollout.max_staleness",
        'Above 0 needs rollout.backend = "vllm" or "vllm-server", rl.updates_per_rollout = 1, and one rank '
        'with "vllm-server"; not with episodes (rl.tools, rl.environment).',
    ),
    Requirement(
        "rollout.sampler_correction",
        'Needs rollout.backend = "vllm" or "vllm-server" (episodes of rl.tools or rl.environment: "vllm").',
    ),
    Requirement(
        "rollout.backend",
        '"vllm" needs the vllm package and parallel.kind "none", "ddp" or "fsdp"; both vLLM backends need'
        ' peft.kind "none" or "lora" and an unquantized base; episodes (rl.tools, rl.environment) take'
        ' "generate" or "vllm".',
    ),
    Requirement(
        "rollout.vllm_server",
        'Read with rollout.backend = "vllm-server": an http(s) address of `ditty rollout-server RECIPE`.',
    ),
    Requirement(
        "rl.guidance_column",
        "Needs rl.rewards (they score the answers) and one-turn rollouts (not rl.tools or rl.environment);"
        ' a built-in dataset\'s prompt rows hold "completion".',
    ),
    Requirement(
        "rl.group_size",
        "At least 2; train.global_batch_size is a multiple of it, and the prompts of a step "
        "(global_batch_size / group_size) split evenly over the data-parallel ranks.",
    ),
    Requirement(
        "rl.credit",
        '"turn" needs rl.importance = "token".',
    ),
    Requirement(
        "rl.kind",
        'Needs data.format = "prompt", train.steps, parallel.kind "none", "ddp" or "fsdp", and no [[pipeline.loss]].',
    ),
    Requirement(
        "rl.tools",
        "Functions (package.module:name), one per name and none async; beside rl.environment they are offered in "
        "it, and a name its tools() offers too is refused.",
    ),
    Requirement(
        "preference.pairs",
        '"online" needs rl.rewards on prompt rows, rl.group_size of 2 or more, a paired kind (not "kto"),'
        ' train.steps, and a reference other than "precompute".',
    ),
    Requirement(
        "preference.kind",
        '"kto" reads data.format = "unpaired_preference"; the others "preference". Packing is refused, '
        "and so is DeepSpeed ZeRO-3.",
    ),
    Requirement(
        "preference.reference",
        'Not with the reference-free kinds ("simpo", "orpo"); "precompute" not with data.streaming.',
    ),
    Requirement(
        "preference.sft_weight",
        'Read by "dpo" and "ipo" only (ORPO has its own NLL term).',
    ),
    Requirement(
        "distill.lmbda",
        "Above 0 refuses data.packing (a packed row holds several prompts).",
    ),
    Requirement(
        "distill.teacher",
        "A causal LM with the student's vocabulary (a directory or hub id).",
    ),
    Requirement(
        "mtp.depth",
        'Above 0 needs model.task = "causal-lm" under SFT or [distill], a verified model type, and no '
        "[[pipeline.loss]], model.factory, DeepSpeed, parallel.tp or parallel.cp.",
    ),
    Requirement(
        "train.stop_when",
        "A `val_*` metric, `>=` or `<=`, and a number; checked after each evaluation (every "
        "train.eval_every steps), so it needs evaluations.",
    ),
    Requirement(
        "model.task",
        '"reward-model" reads data.format = "preference" and refuses data.packing.',
    ),
)
