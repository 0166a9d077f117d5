"""The compiler's rules of the online-pairs row (`[preference] pairs = "online"`, ditty.objectives.
online_pairs): its data format, the paired kinds and references it takes, how it samples ([rollout]'s
rules, as every row that samples) and the [rl] settings it reads (the group size and the reward
functions), warning about any other [rl] key set. Imports nothing heavy: `ditty check` runs them before
any model loads."""

from __future__ import annotations

from typing import Any, Iterator

from ditty.config.errors import Problem, error, warning

DEFAULT_REWARD = "ditty.objectives.rewards.builtin_rewards:exact_match"
"""The reward of online pairs without rl.rewards: exact match against the pair's chosen answer."""

READS_FROM_RL = ("group_size", "rewards", "reward_weights", "reward_timeout_s")
"""The [rl] keys online pairs read: the candidates per prompt and the reward functions that judge them."""


def online_rules(ctx: Any) -> Iterator[Problem]:
    from ditty.objectives.pairs import pair_values, reference_rules
    from ditty.objectives.rl.rl_rules import rewards_resolve
    from ditty.objectives.sampling.rollout_rules import rollout_rules

    cfg = ctx.config
    pref, rl = cfg.preference, cfg.rl
    if pref.kind == "kto":
        yield error(
            "preference.kind", 'pairs = "online" makes pairs, and kto reads unpaired examples', 'use kind = "dpo"'
        )
    if pref.refresh_every < 1:
        yield error("preference.refresh_every", f"must be at least 1, got {pref.refresh_every}", "use 1")
    if rl.group_size < 2:
        yield error("rl.group_size", f"must be at least 2 to make a pair, got {rl.group_size}", "use 4 to 16")
    yield from rollout_rules(ctx, row="online pairs")
    yield from rl_keys_unread(ctx)
    if pref.reference == "precompute":
        yield error(
            "preference.reference",
            '"precompute" scores the training samples before training, and online pairs are sampled during it',
            'use reference = "auto"',
        )
    if not rl.rewards and cfg.data.format == "prompt":
        yield error(
            "rl.rewards",
            'pairs = "online" on prompts needs reward functions to judge the samples',
            f'e.g. ["{DEFAULT_REWARD}"]',
        )
    elif rl.rewards:
        yield from rewards_resolve(ctx)
    elif rl.reward_weights is not None and len(rl.reward_weights) != 1:
        yield error(
            "rl.reward_weights",
            f"has {len(rl.reward_weights)} weights, and without rl.rewards the pairs are judged by one "
            f"function ({DEFAULT_REWARD})",
            "remove rl.reward_weights, or name the functions they weigh in rl.rewards",
        )
    if cfg.train.steps is None:
        yield error("train.steps", 'is needed with pairs = "online": a step samples its own pairs', "set train.steps")
    if cfg.data.packing:
        yield error("data.packing", "preference samples are not packed", "set data.packing = false")
    yield from pair_values(ctx)
    if pref.reference not in ("precompute",):
        yield from reference_rules(ctx)


def rl_keys_unread(ctx: Any) -> Iterator[Problem]:
    """Any [rl] key set but the group size and the reward functions, such as the policy loss or the
    episode settings, has no effect: a warning."""
    unread = sorted(
        path
        for path in ctx.provenance
        if path.startswith("rl.") and ctx.is_set(path) and path.split(".")[1].split("[")[0] not in READS_FROM_RL
    )
    if unread:
        others = f"; nor {'does' if len(unread) == 2 else 'do'} {', '.join(unread[1:])}" if unread[1:] else ""
        yield warning(
            unread[0],
            f'has no effect: pairs = "online" reads only [rl]\'s group size and reward functions '
            f"({', '.join(READS_FROM_RL)}){others}",
            "remove " + ("it" if len(unread) == 1 else "them"),
        )
