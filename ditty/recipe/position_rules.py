"""The rules that compare `data.max_seq_len`, and a rollout's prompt and samples, with the positions
the model has.

A model with learned position embeddings (BERT, GPT-2, OPT, ...) fails in its first forward on a
longer sequence ("The size of tensor a (722) must match the size of tensor b (512)"), after the
weights have loaded; read from config.json offline, the limit is known before anything is built.
Rotary models (a `rope_theta` or `rope_scaling` in the config) compute positions on the fly and
run past the limit, only with quality they were not trained for: a warning for `data.max_seq_len`
(a cap most rows stay far below), an error for a rollout, whose samples are meant to fill it and
which a vLLM engine refuses (its max_model_len).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from ditty.config.errors import Problem
from ditty.recipe.rules import Context, error, rule, warning

POSITION_KEYS = ("max_position_embeddings", "n_positions")
"""Where Hugging Face configs keep the position count (GPT-2 and its kin use n_positions)."""


def model_positions(model: Any) -> tuple[Optional[int], bool, str]:
    """(positions, rotary, where it was read) for a recipe's model; positions None when unknown offline.

    `model.config` overrides win over the checkpoint's config.json, as the model builder applies them.
    """
    from ditty.models.source import read_model_config

    overrides = dict(model.config)
    found = read_model_config(model) or {}
    values = {**found, **overrides}
    for key in POSITION_KEYS:
        if isinstance(values.get(key), int):
            where = f"model.config.{key}" if key in overrides else f"{key} in config.json of {model.path}"
            rotary = any(name in values for name in ROPE_KEYS) or (not found and _rotary_architecture(model))
            return values[key], rotary, where
    return None, False, ""


ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters")


def _rotary_architecture(model: Any) -> bool:
    """Whether a random init of `model.architecture` (no config.json to read) has rotary positions:
    its config class's defaults name a rope setting (Llama's, Qwen's, Mistral's do; GPT-2's do not)."""
    if not model.architecture:
        return False
    try:
        from transformers import AutoConfig

        defaults = AutoConfig.for_model(model.architecture).to_dict()
    except Exception:  # noqa: BLE001 - an unknown architecture is model.source's to report
        return False
    return any(name in defaults for name in ROPE_KEYS)


@rule("data.max_seq_len.positions")
def max_seq_len_within_positions(ctx: Context) -> Iterator[Problem]:
    """`data.max_seq_len` is at most the model's position count (max_position_embeddings)."""
    cfg = ctx.config
    if cfg.model.factory:
        return
    positions, rotary, where = model_positions(cfg.model)
    length = cfg.data.max_seq_len
    if positions is None or not isinstance(length, int) or length <= positions:
        return
    grow = (
        f", or raise model.config.max_position_embeddings to {length} (random init only)"
        if cfg.model.resolved_init == "random"
        else ""
    )
    fix = f"set data.max_seq_len = {positions}{grow}"
    if rotary:
        yield warning(
            "data.max_seq_len",
            f"{length} tokens is longer than the model's {positions} positions ({where}); rotary positions "
            "run past it, with quality the model was not trained for",
            fix,
        )
    else:
        yield error(
            "data.max_seq_len",
            f"{length} tokens is longer than the model's {positions} positions ({where}); its position "
            "embeddings would fail in the first forward",
            fix,
        )


@rule("rollout.positions")
def rollouts_within_positions(ctx: Context) -> Iterator[Problem]:
    """A rollout (a prompt of up to `data.max_seq_len` tokens and what sampling adds after it:
    `rollout.max_new_tokens`, or an episode's `rl.max_episode_tokens`) fits the model's positions, as
    `data.max_seq_len` alone must for the rows that do not sample."""
    from ditty.objectives.table import OBJECTIVES, objective_name

    cfg = ctx.config
    row = objective_name(cfg)
    if cfg.model.factory or row not in OBJECTIVES or "rollout" not in OBJECTIVES[row].sections:
        return
    episodes = row in ("grpo", "rloo") and cfg.rl.plays_episodes
    key, added = (
        ("rl.max_episode_tokens", cfg.rl.max_episode_tokens)
        if episodes
        else ("rollout.max_new_tokens", cfg.rollout.max_new_tokens)
    )
    positions, rotary, where = model_positions(cfg.model)
    prompt = cfg.data.max_seq_len
    if positions is None or not isinstance(prompt, int) or not isinstance(added, int) or prompt + added <= positions:
        return
    what = (
        f"a rollout of data.max_seq_len + {key} = {prompt} + {added} = {prompt + added} tokens is longer than the "
        f"model's {positions} positions ({where})"
    )
    fix = f"set {key} to at most {max(positions - prompt, 1)} (or lower data.max_seq_len)"
    if cfg.model.resolved_init == "random":
        fix += f", or raise model.config.max_position_embeddings to {prompt + added} (random init only)"
    # Every backend is refused alike, so that a recipe checked on generate also runs on vLLM: a vLLM
    # engine refuses such a context (its max_model_len) in its first request, and generate would run a
    # rotary model past its positions at quality it was not trained for (learned positions fail).
    if rotary:
        yield error(
            key,
            f"{what}; a vLLM engine refuses such a context (its max_model_len), and generate would run "
            "past the positions at quality the model was not trained for",
            fix,
        )
    else:
        yield error(key, f"{what}; its position embeddings would fail in the rollout's forward", fix)
