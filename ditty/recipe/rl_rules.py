"""Compiler rules of `[rl]` (GRPO): what can be checked before any weights load.

Registered after the core rules (imported by ditty/recipe/compiler.py). The reward references are
imported here (cheap: `ditty.objectives.rewards` imports no torch) so a reference that does not
resolve, or a function that cannot be called as fn(prompts, completions, **columns), stops the run
before the model is built.
"""

from __future__ import annotations

import importlib.util
from typing import Iterator

from ditty.config.errors import Problem
from ditty.recipe.rules import Context, error, rule, warning

BUILTIN_COLUMNS = ("completion",)
"""The columns a built-in dataset's prompt rows keep for the reward functions."""


def describe(config) -> str:
    """The plan's line for [rl]: what one step samples and how it learns."""
    rl, train = config.rl, config.train
    prompts = train.global_batch_size // max(rl.group_size, 1)
    reference = ", KL to the reference (beta {:g})".format(rl.beta) if rl.beta > 0 else ""
    return (
        f"{rl.kind}: {prompts} prompts x {rl.group_size} completions per step, at most {rl.max_new_tokens} new "
        f"tokens (temperature {rl.temperature:g}), {rl.loss} loss, {len(rl.rewards)} reward function(s){reference}"
    )


@rule("rl.kind")
def rl_needs_prompts(ctx: Context) -> Iterator[Problem]:
    """kind = "grpo" trains on data.format = "prompt", and a prompt format trains only under [rl]."""
    cfg = ctx.config
    sources = [s.format for s in cfg.data.sources if s.format is not None]
    if cfg.rl.kind == "grpo":
        for fmt in [cfg.data.format, *sources]:
            if fmt != "prompt":
                yield error(
                    "data.format",
                    f'rl.kind = "grpo" samples its own completions, so it reads prompts, not data.format = "{fmt}"',
                    'set data.format = "prompt" (a `prompt` column; other columns go to the reward functions)',
                )
                break
        return
    if cfg.data.format == "prompt" or "prompt" in sources:
        yield error(
            "data.format",
            'data.format = "prompt" has no completions to learn from without reinforcement learning',
            'set [rl] kind = "grpo" with reward functions, or use data.format = "prompt_completion"',
        )
    for key in ("group_size", "rewards", "beta", "loss", "max_new_tokens", "updates_per_rollout"):
        if ctx.is_set(f"rl.{key}"):
            yield warning(f"rl.{key}", 'has no effect while rl.kind = "none"', 'set rl.kind = "grpo" to use it')


@rule("rl.values")
def rl_values(ctx: Context) -> Iterator[Problem]:
    """Ranges of the [rl] numbers, and the batch made of whole groups on every rank."""
    rl, train = ctx.config.rl, ctx.config.train
    if rl.kind != "grpo":
        return
    if rl.group_size < 2:
        yield error(
            "rl.group_size",
            f"must be at least 2, got {rl.group_size}: advantages compare the completions of one prompt",
            "use 4 to 16",
        )
    elif train.global_batch_size % rl.group_size:
        yield error(
            "train.global_batch_size",
            f"{train.global_batch_size} completions do not split into groups of rl.group_size = {rl.group_size}",
            f"use a multiple of {rl.group_size}",
        )
    elif (train.global_batch_size // rl.group_size) % ctx.data_parallel_size:
        prompts = train.global_batch_size // rl.group_size
        yield error(
            "train.global_batch_size",
            f"{prompts} prompts per step do not split over {ctx.data_parallel_size} ranks "
            "(each group stays on one rank)",
            f"use a multiple of rl.group_size x ranks = {rl.group_size * ctx.data_parallel_size}",
        )
    checks = [
        ("max_new_tokens", rl.max_new_tokens >= 1, "at least 1"),
        ("temperature", rl.temperature > 0, "above 0 (sampling; greedy rollouts would all agree)"),
        ("top_p", 0 < rl.top_p <= 1, "in (0, 1]"),
        ("clip_low", 0 < rl.clip_low < 1, "in (0, 1)"),
        ("clip_high", rl.clip_high is None or rl.clip_high > 0, "above 0 (or unset: clip_low)"),
        ("beta", rl.beta >= 0, "0 or more"),
        ("updates_per_rollout", rl.updates_per_rollout >= 1, "at least 1"),
        ("generation_batch_size", rl.generation_batch_size >= 0, "0 (all at once) or more"),
    ]
    for key, ok, wanted in checks:
        if not ok:
            yield error(f"rl.{key}", f"must be {wanted}, got {getattr(rl, key)!r}", f"set rl.{key} {wanted}")
    if train.steps is None:
        yield error(
            "train.steps",
            "is needed with [rl]: a step samples global_batch_size / group_size prompts, so epochs are not counted",
            "set train.steps",
        )
    if ctx.config.pipeline.loss:
        yield error(
            "pipeline.loss",
            '[rl] kind = "grpo" brings its own policy loss',
            "remove [[pipeline.loss]] (or rl.kind)",
        )
    if ctx.config.parallel.kind not in ("none", "ddp", "fsdp"):
        yield error(
            "parallel.kind",
            f'rl.kind = "grpo" runs with parallel.kind "none", "ddp" or "fsdp", not "{ctx.config.parallel.kind}"',
            'use parallel.kind = "ddp" or "fsdp"',
        )


@rule("rl.rewards")
def rewards_resolve(ctx: Context) -> Iterator[Problem]:
    """Every reward reference imports, is callable with TRL's signature, and has its weight."""
    cfg = ctx.config
    if cfg.rl.kind != "grpo":
        return
    from ditty.objectives.rewards import resolve_reward_functions

    builtin = cfg.data.source == "builtin" and not cfg.data.sources
    columns = BUILTIN_COLUMNS if builtin else None
    _, problems = resolve_reward_functions(cfg.rl.rewards, cfg.rl.reward_weights, columns=columns)
    yield from problems


@rule("rl.backend")
def vllm_backend(ctx: Context) -> Iterator[Problem]:
    """backend = "vllm" needs vllm and a CUDA GPU; ditty's rollouts otherwise use transformers' generate."""
    rl = ctx.config.rl
    if rl.kind != "grpo" or rl.backend != "vllm":
        return
    missing = []
    if importlib.util.find_spec("vllm") is None:
        missing.append("vllm is not installed")
    if ctx.config.run.device == "cpu" or not _cuda_available():
        missing.append("there is no CUDA GPU")
    reason = " and ".join(missing) if missing else "ditty's vLLM rollout backend is not available in this version"
    yield error(
        "rl.backend",
        f'rl.backend = "vllm" cannot run: {reason}',
        'use rl.backend = "transformers" (generate with a KV cache on the live policy)',
    )


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()
