"""The rows of preference optimisation on pairs read from the data (`[preference] kind`: dpo, ipo,
simpo, orpo on data.format = "preference"; kto on "unpaired_preference"): their parts, compiler
rules, plan rows and model-card line (ditty.objectives.table)."""

from __future__ import annotations

from typing import Any, Iterator

from ditty.config.errors import Problem, error, warning
from ditty.config.preference import REFERENCE_FREE
from ditty.objectives.footprint import Footprint, reference_footprint, reference_kind
from ditty.objectives.parts import ObjectiveParts

REFERENCE_TEXT = {
    "adapter": "the model with its adapter disabled",
    "copy": "a frozen copy of the starting weights",
    "precompute": "log-probabilities precomputed before training",
}


def reference_setting(config: Any) -> str:
    """`preference.reference`, or "none" for the reference-free kinds."""
    pref = config.preference
    return "none" if pref.kind in REFERENCE_FREE else pref.reference


def build_pairs(run: Any) -> ObjectiveParts:
    """The loss (ditty.objectives.preference_loss) and its reference (ditty.objectives.reference)."""
    from ditty.objectives.preference_loss import PreferenceLoss
    from ditty.objectives.reference import build_reference

    cfg = run.config.preference
    reference = build_reference(run, reference_setting(run.config), chunks=cfg.chunks, key="preference.reference")
    return ObjectiveParts(loss=PreferenceLoss(cfg, reference), reference=reference)


def pair_rules(ctx: Any) -> Iterator[Problem]:
    """Its numbers are in range; the reference is one the kind takes and one that exists (the data
    format is the table's check, ditty.recipe.objective_rules)."""
    cfg = ctx.config
    yield from pair_values(ctx)
    if cfg.data.packing:
        yield error(
            "data.packing",
            "preference samples are not packed: each completion is scored as one sequence",
            "set data.packing = false (data.group_by_length = true cuts padding instead)",
        )
    yield from reference_rules(ctx)
    yield from no_zero3(ctx, "preference optimisation")


def pair_values(ctx: Any) -> Iterator[Problem]:
    pref = ctx.config.preference
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
        own = "ORPO has its own NLL term" if pref.kind == "orpo" else f"{pref.kind.upper()} takes no NLL term"
        yield warning("preference.sft_weight", f'has no effect with kind = "{pref.kind}" ({own})', "remove it")
    if pref.chunks < 1:
        yield error("preference.chunks", f"must be at least 1, got {pref.chunks}", "use 8")


def reference_rules(ctx: Any) -> Iterator[Problem]:
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
    from ditty.models.source import frozen_model_problems

    yield from frozen_model_problems(pref.reference, "preference.reference", "reference")


def no_zero3(ctx: Any, what: str) -> Iterator[Problem]:
    cfg = ctx.config
    if cfg.parallel.kind == "deepspeed" and cfg.parallel.zero_stage == 3:
        yield error(
            "parallel.zero_stage",
            f"{what} scores completions through the output head's weight in chunks, outside the "
            "model's forward, where ZeRO-3 leaves each rank only its partition of that weight",
            'use parallel.zero_stage = 2, or parallel.kind = "fsdp" (the policy and reference both sharded)',
        )


def describe_reference(config: Any, setting: str) -> str:
    kind = reference_kind(config, setting)
    if kind == "path":
        return f"reference {setting}"
    return f"reference: {REFERENCE_TEXT[kind]}" if kind else "no reference"


def describe_pairs(config: Any) -> list[tuple[str, str]]:
    pref = config.preference
    unit = "examples" if pref.kind == "kto" else "pairs"
    text = f"{pref.kind} (beta {pref.beta:g}) on {unit}, {describe_reference(config, reference_setting(config))}"
    return [("objective", text)]


def pairs_footprint(config: Any, world_size: int) -> Footprint:
    pref = config.preference
    rows = 1 if pref.kind == "kto" else 2  # a pair is two rows of one forward
    return reference_footprint(
        config, reference_setting(config), method=pref.kind, rows_per_sample=rows, chunks=pref.chunks
    )


def pairs_card(config: Any) -> str:
    pref = config.preference
    reference = "" if pref.kind in REFERENCE_FREE else f", reference {pref.reference}"
    extra = f", sft_weight {pref.sft_weight:g}" if pref.sft_weight and pref.kind in ("dpo", "ipo") else ""
    return f"; preference optimisation: {pref.kind.upper()} (beta {pref.beta:g}{reference}{extra})"
