"""The compiler's rules for `[mtp]` (ditty.models.mtp): where multi-token prediction heads apply.

The heads draft the tokens of a causal LM and train beside the loss of the rows that score the data's
(or the student's own) next tokens: supervised training and on-policy distillation. Everywhere else a
depth above 0 is refused, naming `mtp.depth`, before anything loads.
"""

from __future__ import annotations

import math
import os
from typing import Iterator

from ditty.config.errors import Problem
from ditty.models.mtp.support import MTP_MODEL_TYPES
from ditty.recipe.rule_base import Context, error, rule, warning

ROWS = ("supervised", "gkd")
"""The objective rows the heads train beside (ditty.objectives.table)."""
OFF = "set mtp.depth = 0"


@rule("mtp.values")
def mtp_values(ctx: Context) -> Iterator[Problem]:
    """Depth, weight and decay are numbers the loss can use."""
    mtp = ctx.config.mtp
    if mtp.depth < 0:
        yield error("mtp.depth", f"is {mtp.depth}: it counts tokens ahead", "set mtp.depth = 0 (off) or 1 or more")
    if not (math.isfinite(mtp.weight) and mtp.weight >= 0):
        yield error("mtp.weight", f"is {mtp.weight}: it weighs the heads' loss", "set mtp.weight = 0.1 (0 or more)")
    if not (math.isfinite(mtp.decay) and mtp.decay > 0):
        yield error("mtp.decay", f"is {mtp.decay}: it must be above 0", "set mtp.decay = 1.0 (every depth alike)")


@rule("mtp.applies")
def mtp_applies(ctx: Context) -> Iterator[Problem]:
    """MTP heads need a causal LM of a verified type, trained by a row that scores next tokens, on one
    process, DDP or FSDP, with the row's own loss."""
    config = ctx.config
    depth = config.mtp.depth
    if depth <= 0:
        yield from _unused(ctx) if depth == 0 else ()
        return
    from ditty.models.source import read_model_type
    from ditty.objectives.table import objective_choice

    model = config.model
    row, _ = objective_choice(config)
    if model.task != "causal-lm":
        yield error(
            "mtp.depth",
            f"MTP heads draft the next tokens of a causal LM, and model.task = {model.task!r}",
            f"{OFF} (or train a causal LM)",
        )
        return
    if row not in ROWS:
        yield error(
            "mtp.depth",
            f'MTP heads train beside supervised training and distillation (gkd); this recipe trains "{row}"',
            f"{OFF}; heads trained by an earlier SFT stage are saved in its final/ and trained again by a later "
            "SFT or gkd stage with the same depth",
        )
    if model.factory:
        yield error("mtp.depth", "MTP heads are built for Hugging Face causal LMs, not model.factory models", OFF)
    else:
        model_type = read_model_type(model)
        if model_type is not None and model_type not in MTP_MODEL_TYPES:
            yield error(
                "mtp.depth",
                f'MTP heads are verified for model types {", ".join(sorted(MTP_MODEL_TYPES))}, not "{model_type}"',
                OFF,
            )
    if config.pipeline.loss:
        yield error("mtp.depth", "MTP heads add their loss to the row's own, and [[pipeline.loss]] replaces it", OFF)
    parallel = config.parallel
    if parallel.kind == "deepspeed":
        yield error("mtp.depth", "MTP heads are not supported under DeepSpeed", f'{OFF}, or use parallel.kind = "fsdp"')
    if parallel.tp > 1 or parallel.cp > 1:
        yield error(
            "mtp.depth",
            f"MTP heads are not supported with tensor or context parallel (tp {parallel.tp}, cp {parallel.cp})",
            f"{OFF}, or set parallel.tp = 1 and parallel.cp = 1",
        )
    if depth + 2 > config.data.max_seq_len:
        yield error(
            "mtp.depth",
            f"depth {depth} scores the token {depth + 1} after the next, beyond rows of data.max_seq_len = "
            f"{config.data.max_seq_len}",
            f"set mtp.depth below {max(1, config.data.max_seq_len - 1)}",
        )
    if config.mtp.weight == 0:
        message = "is 0: the heads take no gradient and stay as built or loaded"
        yield warning("mtp.weight", message, "set mtp.weight = 0.1")


def _unused(ctx: Context) -> Iterator[Problem]:
    for key in ("mtp.weight", "mtp.decay", "mtp.trunk_gradient"):
        if ctx.is_set(key):
            message = "has no effect with mtp.depth = 0 (no MTP heads)"
            yield warning(key, message, "set mtp.depth = 1 or more, or remove it")
    local = _local_dir(ctx.config.model)
    if local and os.path.isfile(os.path.join(local, "mtp.safetensors")):
        yield warning(
            "mtp.depth",
            f"is 0, and {ctx.config.model.path} holds MTP heads (mtp.safetensors): this run's final/ has none",
            "set mtp.depth to the heads' depth to keep training them",
        )


def _local_dir(model) -> str | None:
    if model.factory or not model.path or model.resolved_init != "pretrained":
        return None
    path = os.path.expanduser(model.path)
    return path if os.path.isdir(path) else None
