"""Compiler rules for `[model] task` (ditty/models/tasks.py): what the architecture can do, and which
data and options fit the task. Offline and cheap: the model's config.json is read as JSON (local
directory or Hugging Face cache), transformers' auto mappings as text (ditty.models.task_support).
"""

from __future__ import annotations

from typing import Iterator

from ditty.config.errors import Problem
from ditty.models.tasks import TASKS, model_task
from ditty.recipe.rules import Context, error, rule


@rule("model.task")
def task_fits_architecture(ctx: Context) -> Iterator[Problem]:
    """The architecture has a class for the task (an encoder-only model cannot be a causal LM): read
    from the model's config offline; unknown (an uncached hub id) is checked when it loads."""
    from ditty.models.task_support import model_config_with_overrides, task_problem

    model = ctx.config.model
    found = task_problem(model_config_with_overrides(model), model_task(model.task))
    if found:
        message, fix = found
        yield error("model.path" if model.path else "model.architecture", message, fix)


@rule("data.task-format")
def format_fits_task(ctx: Context) -> Iterator[Problem]:
    """`data.format` is one the task reads; a built-in dataset can be read in that format; a masked LM
    has a mask token to mask with."""
    cfg = ctx.config
    task = model_task(cfg.model.task)
    data = cfg.data
    if data.format not in task.data_formats:
        readers = [name for name, other in TASKS.items() if data.format in other.data_formats]
        yield error(
            "data.format",
            f'"{data.format}" is not a format of model.task = "{task.name}" (it reads '
            + " or ".join(f'"{f}"' for f in task.data_formats)
            + ")",
            f'set data.format = "{task.data_formats[0]}"'
            + (f', or model.task = "{readers[0]}" for this data' if readers else ""),
        )
    # Sources and [data.eval] read the same format when the task is not a causal LM: one collator
    # (a classifier's labels, a seq2seq model's decoder inputs) makes every batch.
    others = [(f"data.sources.{i}.format", s.format) for i, s in enumerate(data.sources)]
    others.append(("data.eval.format", data.eval.format))
    for key, fmt in others:
        if fmt is not None and fmt != data.format and (not task.token_rows or fmt not in task.data_formats):
            yield error(
                key,
                f'"{fmt}" differs from data.format = "{data.format}", and model.task = "{task.name}" trains on one '
                "format (one collator makes every batch)",
                f'remove it (the format of [data] applies), or set it to "{data.format}"',
            )
    if data.source == "builtin" and not data.sources:  # [[data.sources]] replace the single source
        from ditty.data import builtin

        formats = builtin.FORMATS.get(data.name)
        if formats is not None and data.format not in formats:
            yield error(
                "data.name",
                f'the built-in {data.name!r} dataset cannot be read as data.format = "{data.format}" '
                f"(it can as {', '.join(formats)})",
                "choose a built-in dataset of this format (" + _builtins_of(data.format) + ")",
            )
    if data.format == "masked_lm" and cfg.tokenizer.kind == "byte":
        yield error(
            "tokenizer.kind",
            'the byte tokenizer has no mask token, which data.format = "masked_lm" needs',
            'use tokenizer.kind = "auto" with a tokenizer that has one (BERT-style tokenizers have [MASK])',
        )
    if not 0 < data.mask_probability < 1:
        yield error("data.mask_probability", f"must be in (0, 1), got {data.mask_probability}")
    if data.max_target_len <= 0:
        yield error("data.max_target_len", f"must be greater than 0, got {data.max_target_len}")


@rule("data.task-packing")
def packing_fits_task(ctx: Context) -> Iterator[Problem]:
    """Packing joins samples into one causal-attention row: only tasks that allow it."""
    task = model_task(ctx.config.model.task)
    if ctx.config.data.packing and not task.packing:
        reason = _NO_PACKING_REASONS.get(task.name, "packing joins several into one causal-attention row")
        yield error(
            "data.packing",
            f'model.task = "{task.name}" trains on one sample per row ({reason})',
            "set data.packing = false (data.group_by_length = true cuts padding instead)",
        )


_NO_PACKING_REASONS = {
    "reward-model": "a reward model scores a whole text at its last token, and a packed row would hold several "
    "texts under one score; each pair's chosen and rejected texts are two rows of one forward instead",
}


def _builtins_of(data_format: str) -> str:
    from ditty.data import builtin

    names = [name for name, formats in builtin.FORMATS.items() if data_format in formats]
    return ", ".join(names) if names else 'none: use data.source = "file" or "hub"'
