"""Compiler rules for preference optimisation (`[preference]` with data.format "preference" or
"unpaired_preference"). Registered after the core rules (imported by ditty/recipe/compiler.py)."""

from __future__ import annotations

import dataclasses
from typing import Iterator

from ditty.config.errors import Problem
from ditty.config.preference import REFERENCE_FREE
from ditty.recipe.rules import Context, error, rule, warning

PREFERENCE_FORMATS = ("preference", "unpaired_preference")


def preference_training(config) -> bool:
    """Whether the run trains a causal LM on preference data (the `[preference]` section applies)."""
    return config.data.format in PREFERENCE_FORMATS and getattr(config.model, "task", "causal-lm") == "causal-lm"


@rule("preference.kind")
def preference_fits(ctx: Context) -> Iterator[Problem]:
    """The loss reads the data it is given; the reference is one the kind takes and one that exists."""
    cfg = ctx.config
    pref = cfg.preference
    if not preference_training(cfg):
        given = sorted(p for p in ctx.provenance if p.startswith("preference.") and ctx.is_set(p))
        task = getattr(cfg.model, "task", "causal-lm")
        if given and task != "causal-lm":
            yield warning(
                given[0],
                f'[preference] has no effect: it trains a causal LM, and model.task is "{task}"'
                + (" (trained with its own Bradley-Terry loss)" if task == "reward-model" else ""),
                "remove [preference]",
            )
        elif given:
            yield warning(
                given[0],
                f'[preference] has no effect: data.format is "{cfg.data.format}"',
                'set data.format = "preference" (or "unpaired_preference" for kto), or remove [preference]',
            )
        return
    wanted = "unpaired_preference" if pref.kind == "kto" else "preference"
    if cfg.data.format != wanted:
        yield error(
            "preference.kind",
            f'preference.kind = "{pref.kind}" reads data.format = "{wanted}", and the data is "{cfg.data.format}"',
            'use kind = "kto" for unpaired examples (prompt, completion, label)'
            if cfg.data.format == "unpaired_preference"
            else 'use data.format = "unpaired_preference" rows (prompt, completion, label) for kto, or another kind',
        )
    if pref.beta <= 0:
        yield error("preference.beta", f"must be positive, got {pref.beta}", "use TRL's default, 0.1")
    if not 0.0 <= pref.label_smoothing < 0.5:
        yield error(
            "preference.label_smoothing",
            f"is a flip probability in [0, 0.5), got {pref.label_smoothing}",
            "use 0 (plain DPO) or e.g. 0.1",
        )
    if pref.sft_weight < 0:
        yield error(
            "preference.sft_weight", f"must not be negative, got {pref.sft_weight}", "use 0 (plain DPO) or e.g. 1.0"
        )
    elif pref.sft_weight and pref.kind not in ("dpo", "ipo"):
        yield warning(
            "preference.sft_weight",
            f'has no effect with kind = "{pref.kind}" (ORPO has its own NLL term)',
            "remove preference.sft_weight",
        )
    if pref.chunks < 1:
        yield error("preference.chunks", f"must be at least 1, got {pref.chunks}", "use 8")
    if cfg.data.packing:
        yield error(
            "data.packing",
            "preference samples are not packed: each completion is scored as one sequence",
            "set data.packing = false (data.group_by_length = true cuts padding instead)",
        )
    yield from _reference(ctx)
    if cfg.parallel.kind == "deepspeed" and cfg.parallel.zero_stage == 3:
        yield error(
            "parallel.zero_stage",
            "preference optimisation scores completions through the output head's weight in chunks, outside the "
            "model's forward, where ZeRO-3 leaves each rank only its partition of that weight",
            'use parallel.zero_stage = 2, or parallel.kind = "fsdp" (the policy and reference both sharded)',
        )


def _reference(ctx: Context) -> Iterator[Problem]:
    cfg, pref = ctx.config, ctx.config.preference
    explicit = ctx.provenance.get("preference.reference", "default") != "default"
    if pref.kind in REFERENCE_FREE:
        if explicit:
            yield error(
                "preference.reference",
                f'preference.kind = "{pref.kind}" is reference-free: it reads no reference model',
                "remove preference.reference",
            )
        return
    if pref.reference == "precompute":
        if cfg.data.streaming:
            yield error(
                "preference.reference",
                '"precompute" scores every training sample before training, and a stream cannot be read ahead',
                'use reference = "auto", or data.streaming = false',
            )
        return
    if pref.reference == "auto":
        return
    from ditty.models.source import _check_path

    for problem in _check_path(pref.reference):
        yield dataclasses.replace(problem, key="preference.reference")
