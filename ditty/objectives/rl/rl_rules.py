"""Compiler rules of the RL rows (`[rl]`: GRPO, RLOO): what can be checked before any weights load.

The objective table runs them when a recipe trains an RL row. The reward references are imported here
(cheap: `ditty.objectives.rewards` imports no torch) so a reference that does not resolve, or a
function that cannot be called as fn(prompts, completions, **columns), stops the run before the model
is built.
"""

from __future__ import annotations

from typing import Iterator

from ditty.config.errors import Problem, error

BUILTIN_COLUMNS = ("completion",)
"""The columns a built-in dataset's prompt rows keep for the reward functions."""


def rl_rules(ctx) -> Iterator[Problem]:
    """Every check of an RL row, in order."""
    yield from reads_prompts(ctx)
    yield from rl_values(ctx)
    yield from rewards_resolve(ctx)
    yield from vllm_backend(ctx)


def reads_prompts(ctx) -> Iterator[Problem]:
    """The RL rows sample their own completions: they read prompts."""
    cfg = ctx.config
    sources = [s.format for s in cfg.data.sources if s.format is not None]
    for fmt in [cfg.data.format, *sources]:
        if fmt != "prompt":
            yield error(
                "data.format",
                f'rl.kind = "{cfg.rl.kind}" samples its own completions, so it reads prompts, '
                f'not data.format = "{fmt}"',
                'set data.format = "prompt" (a `prompt` column; other columns go to the reward functions)',
            )
            break


def rl_values(ctx) -> Iterator[Problem]:
    """Ranges of the [rl] numbers, and the batch made of whole groups on every rank."""
    rl, train = ctx.config.rl, ctx.config.train
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
            "[rl] brings its own policy loss",
            "remove [[pipeline.loss]] (or rl.kind)",
        )
    if ctx.config.parallel.kind not in ("none", "ddp", "fsdp"):
        yield error(
            "parallel.kind",
            f'[rl] runs with parallel.kind "none", "ddp" or "fsdp", not "{ctx.config.parallel.kind}"',
            'use parallel.kind = "ddp" or "fsdp"',
        )


def rewards_resolve(ctx) -> Iterator[Problem]:
    """Every reward reference imports, is callable with TRL's signature, and has its weight."""
    cfg = ctx.config
    from ditty.objectives.rewards import resolve_reward_functions

    builtin = cfg.data.source == "builtin" and not cfg.data.sources
    columns = BUILTIN_COLUMNS if builtin else None
    _, problems = resolve_reward_functions(cfg.rl.rewards, cfg.rl.reward_weights, columns=columns)
    yield from problems


def vllm_backend(ctx) -> Iterator[Problem]:
    """The rollout backend and what rides on it (ditty.objectives.rl.backend_rules)."""
    from ditty.objectives.rl.backend_rules import backend_rules

    yield from backend_rules(ctx)
