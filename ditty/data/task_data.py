"""`build_task_data`: the training and validation samples of a task format, with its label set.

The rows come from where the causal-LM formats' rows come from (ditty.data.sources: local files or
a hub dataset; ditty.data.builtin: a generated dataset), or from the Python API as a list of dicts
or a `datasets.Dataset`. They are checked (ditty.data.task_rows.check_rows), the label set is
taken from the training rows, the validation rows are checked against it, and both are tokenized.
Validation is `data.val_path`, else a seeded `data.val_fraction` of the rows (built-in datasets hold
out whole problems, as for the causal-LM formats).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from ditty.config.errors import RecipeError
from ditty.data.task_collate import TaskCollator
from ditty.data.task_formats import encode_rows
from ditty.data.task_rows import LabelSpace, RowSource, check_labels_known, check_rows

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from ditty.config.sections import DataConfig


@dataclass(frozen=True)
class TaskData:
    """What the task data mode trains and evaluates on (the counterpart of `DataBundle`)."""

    train: "Dataset"
    val: Optional["Dataset"]
    seed: int
    format: str
    collator: TaskCollator
    labels: Optional[LabelSpace] = None
    """The label set of classification and token classification (None for the other formats)."""
    max_new_tokens: int = 0
    """seq2seq: the longest validation target in tokens (what greedy decoding generates for exact match)."""
    skipped_rows: int = 0
    """Bad rows left out under `data.on_bad_rows = "skip"` (training and validation together)."""
    task = None  # no causal-LM generation task (DataMode.task)


@dataclass(frozen=True)
class RawRows:
    dataset: "Dataset"
    source: RowSource

    def keeping(self, indices: Optional[list[int]]) -> "RawRows":
        """These rows only (None: all); messages keep naming rows by their original numbers."""
        if indices is None:
            return self
        numbers = tuple(self.source.rows[i] for i in indices) if self.source.rows is not None else tuple(indices)
        return RawRows(self.dataset.select(indices), replace(self.source, rows=numbers))


def build_task_data(
    data: "DataConfig",
    tokenizer: "PreTrainedTokenizerBase",
    seed: int,
    *,
    label_hint: Optional[Sequence[str]] = None,
    decoder_start_token_id: Optional[int] = None,
    rows: Any = None,
    val_rows: Any = None,
) -> TaskData:
    """Load, check, label and tokenize the rows `data` names (or the Python API's `rows`).

    `label_hint`: a pretrained classifier's label names (LabelSpace.from_values keeps them when they
    cover the data); `decoder_start_token_id`: the seq2seq model's (the collator shifts labels behind it).
    """
    from ditty.data.sources import progress_bars_on_main_rank

    seed = data.shuffle_seed if data.shuffle_seed is not None else seed
    with progress_bars_on_main_rank():
        train, val = _raw_rows(data, seed, rows, val_rows)
        values, kept, skipped = check_rows(train.dataset, data, train.source)
        train = train.keeping(kept)
        labels = LabelSpace.from_values(values, label_hint) if values else None
        if val is not None:
            _, kept, skipped_val = check_rows(val.dataset, data, val.source)
            val, skipped = val.keeping(kept), skipped + skipped_val
            if labels is not None:
                check_labels_known(val.dataset, data, labels, val.source)
        train_set = encode_rows(train.dataset, tokenizer, data, labels, what="training")
        val_set = encode_rows(val.dataset, tokenizer, data, labels, what="validation") if val is not None else None
    collator = TaskCollator(
        format=data.format,
        pad_token_id=tokenizer.pad_token_id,
        decoder_start_token_id=decoder_start_token_id,
        mask_token_id=tokenizer.mask_token_id,
        vocab_size=len(tokenizer),
        mask_probability=data.mask_probability,
        seed=seed,
    )
    longest_target = 0
    if data.format == "seq2seq" and val_set is not None:
        longest_target = max(len(ids) for ids in val_set["labels"])
    return TaskData(train_set, val_set, seed, data.format, collator, labels, longest_target, skipped)


def _raw_rows(data: "DataConfig", seed: int, rows: Any, val_rows: Any) -> tuple[RawRows, Optional[RawRows]]:
    from ditty.data.sources import load_file_dataset, load_hub_dataset

    if rows is not None:
        train = RawRows(_as_dataset(rows), RowSource("the training dataset", key="dataset"))
        if val_rows is not None:
            return train, RawRows(_as_dataset(val_rows), RowSource("the validation dataset", key="val_dataset"))
        return _split(train, data.val_fraction, seed)
    if data.source == "builtin":
        return _builtin_rows(data)
    # Rows that cannot be read (malformed JSON, a column changing type) are reported, or skipped and
    # counted there; check_rows then does the same for what the task needs of each row.
    reading = dict(cache_dir=data.cache_dir, on_bad_rows=data.on_bad_rows, max_row_bytes=data.max_row_bytes)
    if data.source == "file":
        dataset = load_file_dataset(data.path, key="data.path", **reading)
        train = RawRows(dataset, RowSource(data.path, "data.path", _files(data.path)))
    else:
        dataset = load_hub_dataset(data.name, split=data.split, cache_dir=data.cache_dir)
        train = RawRows(dataset, RowSource(f"hub dataset {data.name} ({data.split})", "data.name"))
    if data.val_path:
        dataset = load_file_dataset(data.val_path, key="data.val_path", **reading)
        return train, RawRows(dataset, RowSource(data.val_path, "data.val_path", _files(data.val_path)))
    return _split(train, data.val_fraction, seed)


def _files(pattern: str) -> tuple[str, ...]:
    return tuple(sorted(glob.glob(os.path.expanduser(pattern))))


def _as_dataset(rows: Any) -> "Dataset":
    from datasets import Dataset

    if isinstance(rows, Dataset):
        return rows
    try:
        return Dataset.from_list(list(rows))
    except (TypeError, ValueError) as error:
        raise RecipeError.single(
            f"the rows cannot be read as a table: {error}",
            key="dataset",
            fix="give a list of dicts (one per row) or a datasets.Dataset",
        ) from error


def _split(train: RawRows, fraction: float, seed: int) -> tuple[RawRows, Optional[RawRows]]:
    """A seeded `fraction` of the rows held out (at least one); the rest trains. Rows keep their
    original numbers in error messages."""
    if fraction <= 0:
        return train, None
    count = len(train.dataset)
    val_size = max(1, round(count * fraction))
    if val_size >= count:
        raise RecipeError.single(
            f"holding out {fraction} of {count} samples leaves nothing to train on",
            key="data.val_fraction",
            fix="lower data.val_fraction (0 disables validation), or give a data.val_path",
        )
    order = np.random.default_rng([seed, count]).permutation(count)
    val_rows, train_rows = sorted(order[:val_size].tolist()), sorted(order[val_size:].tolist())
    return (
        RawRows(train.dataset.select(train_rows), replace(train.source, rows=tuple(train_rows))),
        RawRows(train.dataset.select(val_rows), replace(train.source, rows=tuple(val_rows))),
    )


def _builtin_rows(data: "DataConfig") -> tuple[RawRows, Optional[RawRows]]:
    from datasets import Dataset

    from ditty.data import builtin

    if data.name not in builtin.GENERATORS:
        raise RecipeError.single(
            f"unknown built-in dataset {data.name!r}",
            key="data.name",
            fix=f"use one of {', '.join(builtin.GENERATORS)}",
        )
    columns = _builtin_columns(data)
    train_problems, held_out = builtin.split_problems(
        builtin.generate_problems(data.name, data.num_samples), data.val_fraction
    )

    def as_rows(problems: list, what: str, key: str) -> RawRows:
        first, second = zip(*problems) if problems else ((), ())
        dataset = Dataset.from_dict({columns[0]: list(first), columns[1]: list(second)})
        return RawRows(dataset, RowSource(f"built-in {data.name} ({what})", key))

    train = as_rows(train_problems, "training", "data.num_samples")
    return train, as_rows(held_out, "held out", "data.val_fraction") if held_out else None


def _builtin_columns(data: "DataConfig") -> tuple[str, str]:
    from ditty.data import builtin

    if data.format not in builtin.FORMATS[data.name]:
        raise RecipeError.single(
            f'the built-in {data.name!r} dataset cannot be read as data.format = "{data.format}"',
            key="data.format",
            fix=f"use data.format = one of {', '.join(builtin.FORMATS[data.name])}, or another data.name",
        )
    if data.format == "classification":
        return data.text_column, data.label_column
    return data.source_column, data.target_column
