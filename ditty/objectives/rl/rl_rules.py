"""Compiler rules of the RL rows (`[rl]`: GRPO, RLOO): what can be checked before any weights load.

The objective table runs them when a recipe trains an RL row. The reward references are imported here
(cheap: `ditty.objectives.rewards.functions` imports no torch) so a reference that does not resolve, or a
function that cannot be called as fn(prompts, completions, **columns), stops the run before the model
is built.
"""

from __future__ import annotations

from typing import Any, Iterator

from ditty.config.errors import Problem, error, warning

BUILTIN_COLUMNS = ("completion",)
"""The columns a built-in dataset's prompt rows keep for the reward functions."""


def rl_rules(ctx) -> Iterator[Problem]:
    """Every check of an RL row, in order."""
    yield from rl_values(ctx)
    yield from parts_resolve(ctx)
    yield from rewards_resolve(ctx)
    yield from guidance(ctx)
    yield from vllm_backend(ctx)
    yield from episodes(ctx)


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
        ("clip_low", 0 < rl.clip_low < 1, "in (0, 1)"),
        ("clip_high", rl.clip_high is None or rl.clip_high > 0, "above 0 (or unset: clip_low)"),
        ("beta", rl.beta >= 0, "0 or more"),
        ("negative_advantage_scale", rl.negative_advantage_scale >= 0, "0 or more (1: the estimator's own)"),
        ("updates_per_rollout", rl.updates_per_rollout >= 1, "at least 1"),
    ]
    yield from _ranges(rl, checks)
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


def _ranges(rl, checks) -> Iterator[Problem]:
    for key, ok, wanted in checks:
        if not ok:
            yield error(f"rl.{key}", f"must be {wanted}, got {getattr(rl, key)!r}", f"set rl.{key} {wanted}")


ESTIMATOR_ARGUMENTS = ("rewards", "group_size", "lengths")
"""How the stream calls an advantage estimator: fn(rewards, group_size, lengths)."""
LOSS_KEYWORDS = (
    "global_sequences",
    "global_tokens",
    "reference_logps",
    "beta",
    "clip_low",
    "clip_high",
    "importance",
    "max_new_tokens",
    "token_weights",
)
"""How the loss stage calls a policy loss: fn(logps, old_logps, advantages, mask, **these)."""


def parts_resolve(ctx) -> Iterator[Problem]:
    """`rl.advantage` and `rl.loss`: a built-in's name, or a function of one's own that imports and takes
    the arguments ditty calls it with (ditty.objectives.rl.estimators, ditty.objectives.rl.policy_losses)."""
    from ditty.objectives.rl.estimators import ESTIMATORS
    from ditty.objectives.rl.policy_losses import POLICY_LOSSES

    rl = ctx.config.rl
    yield from _part(rl.advantage, "rl.advantage", tuple(ESTIMATORS), "advantage estimator", ESTIMATOR_ARGUMENTS, ())
    loss_arguments = ("logps", "old_logps", "advantages", "mask")
    yield from _part(rl.loss, "rl.loss", POLICY_LOSSES, "policy loss", loss_arguments, LOSS_KEYWORDS)
    if rl.credit == "turn" and rl.advantage != "group":
        yield error(
            "rl.credit",
            f"per-turn credit normalises every turn reward of a group (GRPO's estimator), and rl.advantage = "
            f"{rl.advantage!r} estimates one advantage per completion: the two do not compose",
            'set rl.advantage = "group", or rl.credit = "episode"',
        )


def _part(value, key, built_ins, what, positional, keywords) -> Iterator[Problem]:
    """A part named by `value`: one of `built_ins`, or "package.module:function" callable as
    fn(*positional, **keywords)."""
    import inspect

    from ditty.config.references import is_code_reference, resolve_reference

    if value in built_ins:
        return
    names = ", ".join(f'"{name}"' for name in built_ins)
    if not is_code_reference(value):
        yield error(key, f"{value!r} is neither a built-in {what} ({names}) nor a function", f"use one of {names}, "
                    'or your own as "package.module:function"')  # fmt: skip
        return
    function, problems = resolve_reference(value, key=key)
    yield from problems
    if function is None:
        return
    if not callable(function):
        yield error(key, f"{value} is a {type(function).__name__}, not a function", f"name a {what} function")
        return
    try:
        inspect.signature(function).bind(*positional, **dict.fromkeys(keywords))
    except TypeError as exc:
        call = ", ".join([*positional, *(f"{k}=..." for k in keywords)])
        yield error(key, f"{value} cannot be called as fn({call}): {exc}", f"give the {what} that signature")
    except ValueError:  # a builtin without a signature: checked when it runs
        return


def rewards_resolve(ctx) -> Iterator[Problem]:
    """Every reward reference imports, is callable with TRL's signature, and has its weight."""
    cfg = ctx.config
    from ditty.objectives.rewards.functions import resolve_reward_functions

    if not cfg.rl.rewards and cfg.rl.environment:  # the environment's own rewards suffice
        return
    builtin = cfg.data.source == "builtin" and not cfg.data.sources
    columns = BUILTIN_COLUMNS if builtin else None
    _, problems = resolve_reward_functions(cfg.rl.rewards, cfg.rl.reward_weights, columns=columns)
    yield from problems


def guidance(ctx) -> Iterator[Problem]:
    """`rl.guidance_column` puts the data's answer in one-turn groups, scored by the reward functions:
    a built-in dataset's rows keep only BUILTIN_COLUMNS (another dataset's columns are read at the
    first step, where a missing one is exit 2 too)."""
    rl, data = ctx.config.rl, ctx.config.data
    if not rl.guidance_column:
        return
    if rl.plays_episodes:
        yield error(
            "rl.guidance_column",
            "puts the data's answer in place of a one-turn completion, and these rollouts are episodes "
            "(rl.environment or rl.tools), whose turns depend on the environment's answers",
            "leave rl.guidance_column unset with episodes",
        )
    elif not rl.rewards:
        yield error("rl.guidance_column", "the answers are scored by rl.rewards, and none is named", "name them")
    elif data.source == "builtin" and not data.sources and rl.guidance_column not in BUILTIN_COLUMNS:
        yield error(
            "rl.guidance_column",
            f"the built-in dataset's prompt rows have no column {rl.guidance_column!r}",
            f"use {BUILTIN_COLUMNS[0]!r}",
        )


def vllm_backend(ctx) -> Iterator[Problem]:
    """How the rollouts are sampled: [rollout]'s rules (ditty.objectives.sampling.rollout_rules)."""
    from ditty.objectives.sampling.rollout_rules import rollout_rules

    yield from rollout_rules(ctx, updates_per_rollout=ctx.config.rl.updates_per_rollout)


def environment_arguments(rl: Any, cls: type) -> Iterator[Problem]:
    """`rl.environment_args` builds `cls`: every parameter without a default is given, and every key
    is a parameter (or the constructor takes **kwargs)."""
    import inspect

    given = dict(rl.environment_args)
    if needed := [name for name in arguments_needed(cls) if name not in given]:
        yield error(
            "rl.environment_args" if given else "rl.environment",
            f"{rl.environment} cannot be built "
            f"{'with rl.environment_args ' + repr(given) if given else 'without arguments'}"
            f" (it needs {', '.join(needed)}): ditty builds one per episode as Name(**rl.environment_args)",
            f"give {', '.join(needed)} in rl.environment_args (a table: environment_args = {{ {needed[0]} = ... }}), "
            "or defaults in the constructor",
        )
    try:
        params = inspect.signature(getattr(cls, "original_class", None) or cls).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    takes = [name for name, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    if unknown := [name for name in given if name not in takes]:
        yield error(
            "rl.environment_args",
            f"{rl.environment} takes no argument {', '.join(map(repr, unknown))} "
            f"(its constructor takes {', '.join(takes) or 'none'})",
            "remove it, or spell it as the constructor does",
        )


def arguments_needed(cls: type) -> list[str]:
    """The parameters `cls()` would miss (none when its signature cannot be read). A wrapper of the
    original Ditty's environments (ditty.compat.environments.as_environment) builds its
    `original_class()`: that class's parameters are the ones that count."""
    import inspect

    wrapped = getattr(cls, "original_class", None)
    if isinstance(wrapped, type):
        cls = wrapped
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in params if p.default is p.empty and p.kind not in kinds]


EPISODE_KEYS = (
    "max_turns",
    "max_episode_tokens",
    "tool_timeout_s",
    "tools_isolation",
    "environment_timeout_s",
    "credit",
)


def episodes(ctx) -> Iterator[Problem]:
    """`rl.environment` names a class with reset and step; every `rl.tools` entry a function (one per
    name); the episode limits are in range; a setting that only episodes read is set without them."""
    rl, rollout = ctx.config.rl, ctx.config.rollout
    from ditty.config.references import resolve_reference
    from ditty.objectives.environments.tools.worker import ASYNC_FIX, ASYNC_TOOL, is_async
    from ditty.objectives.sampling.rollout_rules import backend

    if rl.environment:
        cls, problems = resolve_reference(rl.environment, key="rl.environment")
        yield from problems
        missing = [name for name in ("reset", "step") if cls is not None and not callable(getattr(cls, name, None))]
        if cls is not None and (not isinstance(cls, type) or missing):
            what = f"has no {' or '.join(missing)} method" if isinstance(cls, type) else "is not a class"
            yield error(
                "rl.environment",
                f"{rl.environment} {what}",
                "name a class with reset(row) -> observation and step(completion) -> StepResult "
                "(ditty.objectives.environments.protocol)",
            )
        elif cls is not None:
            yield from environment_arguments(rl, cls)
    elif rl.environment_args:
        yield error(
            "rl.environment_args",
            "builds the rl.environment class, and none is named",
            'name the class (rl.environment = "package.module:Name"), or remove rl.environment_args',
        )
    names: dict[str, int] = {}
    for index, reference in enumerate(rl.tools):
        key = f"rl.tools[{index}]"
        function, problems = resolve_reference(reference, key=key)
        yield from problems
        if function is not None and not callable(function):
            yield error(key, f"{reference} is a {type(function).__name__}, not a function", "name a function")
        elif function is not None and is_async(function):
            yield error(key, f"{reference} {ASYNC_TOOL}", ASYNC_FIX)
        name = str(reference).rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        if name in names and not problems:
            yield error(key, f"a second tool named {name!r} (rl.tools[{names[name]}])", "give every tool its own name")
        names.setdefault(name, index)
    checks = [
        ("max_turns", rl.max_turns >= 1, "at least 1"),
        ("max_episode_tokens", rl.max_episode_tokens >= 1, "at least 1"),
        ("tool_timeout_s", rl.tool_timeout_s > 0, "above 0"),
        ("environment_timeout_s", rl.environment_timeout_s >= 0, "0 (no limit) or more"),
    ]
    for key, ok, wanted in checks:
        if not ok:
            yield error(f"rl.{key}", f"must be {wanted}, got {getattr(rl, key)!r}", f"set rl.{key} {wanted}")
    if rl.credit == "turn" and rl.importance != "token":
        yield error(
            "rl.credit",
            'per-turn credit gives each token its own advantage, which needs rl.importance = "token"',
            'set rl.importance = "token", or rl.credit = "episode"',
        )
    if rl.plays_episodes and backend(rollout) not in ("generate", "vllm"):
        yield error(
            "rollout.backend",
            "episodes of several turns (rl.environment, rl.tools) sample with the generate or the vllm "
            f"backend, not {rollout.backend!r}",
            'set rollout.backend = "generate" or "vllm", or leave rl.environment and rl.tools out',
        )
    if rl.plays_episodes and rollout.max_staleness > 0:
        yield error(
            "rollout.max_staleness",
            "episodes of several turns are sampled in step with training (their environments are not thread-safe)",
            "set rollout.max_staleness = 0, or leave rl.environment and rl.tools out",
        )
    if not rl.plays_episodes:
        for key in EPISODE_KEYS:
            if ctx.is_set(f"rl.{key}"):
                yield warning(
                    f"rl.{key}",
                    "has no effect: without rl.environment or rl.tools an episode is one turn, scored by the "
                    "reward functions",
                    "remove it, or name rl.environment or rl.tools",
                )
