"""The data formats, in one table: `data.format` -> its `DataFormat` object (ditty.data.formats.base).

Adding a format is one new module here with a `DataFormat` subclass and one row of `FORMATS` (its
name also goes into `DataConfig.format`'s Literal, which a test holds equal to this table, and into
the `data_formats` of the model task that reads it). `tokenize` is the one place rows become samples.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

from ditty.config.errors import RecipeError
from ditty.data.formats.base import CUT_PROBLEM, DataFormat
from ditty.data.formats.classification import ClassificationFormat
from ditty.data.formats.images import BUILTINS as IMAGE_BUILTINS
from ditty.data.formats.images import ImagesFormat
from ditty.data.formats.lm import ChatFormat, PromptCompletionFormat, TextFormat
from ditty.data.formats.masked_lm import MaskedLMFormat
from ditty.data.formats.preference_rows import PreferenceFormat, UnpairedPreferenceFormat
from ditty.data.formats.prompt import PromptFormat
from ditty.data.formats.seq2seq import Seq2SeqFormat
from ditty.data.formats.token_classification import TokenClassificationFormat
from ditty.data.rows import require_columns

if TYPE_CHECKING:
    from datasets import Dataset

    from ditty.config.sections import DataConfig
    from ditty.data.labels import LabelSpace

log = logging.getLogger("ditty.data")

FORMATS: dict[str, DataFormat] = {
    fmt.name: fmt
    for fmt in (
        TextFormat(),
        PromptCompletionFormat(),
        ChatFormat(),
        ClassificationFormat(),
        TokenClassificationFormat(),
        Seq2SeqFormat(),
        MaskedLMFormat(),
        PreferenceFormat(),
        UnpairedPreferenceFormat(),
        PromptFormat(),
        ImagesFormat(),
    )
}


def data_format(name: str) -> DataFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise RecipeError.single(
            f"unknown data format {name!r}", key="data.format", fix=f"use one of {', '.join(FORMATS)}"
        ) from None


def format_of(data: "DataConfig") -> DataFormat:
    """The format `data`'s rows are read in: `data.format`, or the one a built-in image dataset implies."""
    if data.source == "builtin" and data.name in IMAGE_BUILTINS and not data.sources:
        return FORMATS[ImagesFormat.name]
    return data_format(data.format)


def tokenize(
    dataset: "Dataset",
    tokenizer: Any,
    data: "DataConfig",
    *,
    source_key: str,
    description: str = "the data",
    labels: Optional["LabelSpace"] = None,
) -> "Dataset":
    """The samples of checked rows in `data.format` (`tokenize_counted` without its count)."""
    return tokenize_counted(dataset, tokenizer, data, source_key=source_key, description=description, labels=labels)[0]


def tokenize_counted(
    dataset: "Dataset",
    tokenizer: Any,
    data: "DataConfig",
    *,
    source_key: str,
    description: str = "the data",
    labels: Optional["LabelSpace"] = None,
) -> tuple["Dataset", int]:
    """The samples of checked rows in `data.format` (the raw columns are dropped), and how many the
    cut to max_seq_len made unusable and `data.on_bad_rows = "skip"` left out; a RecipeError for no
    rows, a missing column, a tokenizer the format cannot use, such samples (unless skipped), or no
    sample left after truncation. `source_key`: the recipe key that named the data, for messages."""
    fmt = format_of(data)
    if not fmt.tokenized:
        return dataset, 0
    require_columns(dataset, fmt.columns_found(data, dataset.column_names), description, source_key)
    fmt.check_tokenizer(tokenizer, data)
    tokenized = dataset.map(
        fmt.encoder(tokenizer, data, labels),
        batched=True,
        remove_columns=dataset.column_names,
        desc=f"tokenizing ({data.format})",
    )
    tokenized, unusable = _without_cut_problems(tokenized, data, source_key, rows=len(dataset))
    dropped = len(dataset) - len(tokenized) - unusable
    if len(tokenized) == 0:
        raise RecipeError.single(
            f"none of the {len(dataset)} samples has a token to learn once cut to max_seq_len = {data.max_seq_len} "
            "(prompts that fill the whole length leave no completion)",
            key="data.max_seq_len",
            fix="raise data.max_seq_len, or check that the completion/assistant columns are not empty",
        )
    if dropped:
        log.warning("dropped %d of %d samples with no token to learn (%s)", dropped, len(dataset), source_key)
    return tokenized, unusable


def _without_cut_problems(tokenized: "Dataset", data: "DataConfig", source_key: str, *, rows: int):
    """(the samples without a CUT_PROBLEM, how many had one); a RecipeError for them unless skipped."""
    if CUT_PROBLEM not in tokenized.column_names:
        return tokenized, 0
    problems = tokenized[CUT_PROBLEM]
    tokenized = tokenized.remove_columns(CUT_PROBLEM)
    bad = [index for index, problem in enumerate(problems) if problem]
    if not bad:
        return tokenized, 0
    check_cut_problems([problems[i] for i in bad], data, source_key, rows=rows)
    keep = set(bad)
    return tokenized.select([i for i in range(len(problems)) if i not in keep]), len(bad)


def check_cut_problems(problems: list[str], data: "DataConfig", where: str, *, rows: int) -> None:
    """Samples the cut to max_seq_len made unusable: a RecipeError, or (data.on_bad_rows = "skip") a
    warning; they are bad rows either way (streamed ones included)."""
    what = (
        f"{len(problems)} of {rows} samples of {where} cannot be used once cut to data.max_seq_len = "
        f"{data.max_seq_len} tokens"
    )
    if data.on_bad_rows != "skip":
        raise RecipeError.single(
            f"{what}; the first: {problems[0]}",
            key="data.max_seq_len",
            fix='raise data.max_seq_len to fit them, or set data.on_bad_rows = "skip" to train without them '
            "(counted as skipped_rows)",
        )
    log.warning('skipping %s (data.on_bad_rows = "skip"); the first: %s', what, problems[0])
