"""Rows of the task formats ("classification", "token_classification", "seq2seq", "masked_lm")
checked before anything is tokenized, and the label set they define.

`check_rows`: a missing field, a value of the wrong type or an empty text is a RecipeError naming
the file and row (up to five bad rows at once), or with `data.on_bad_rows = "skip"` a row left out
and counted. Labels are read in the same pass: `LabelSpace` is the label set of the training data,
which becomes the model config's num_labels / id2label / label2id; a validation label that training
never saw is an error naming its row (`check_labels_known`). Turning checked rows into model
inputs is ditty.data.task_formats.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from ditty.config.errors import RecipeError
from ditty.data.rows import require_columns

if TYPE_CHECKING:
    from datasets import Dataset

    from ditty.config.sections import DataConfig

log = logging.getLogger("ditty.data")
MAX_REPORTED_ROWS = 5
_DEFAULT_LABEL = re.compile(r"LABEL_\d+")


# ---------------------------------------------------------------------------- where a row came from


@dataclass(frozen=True)
class RowSource:
    """Names a row for error messages: "data/train.jsonl, row 7" (rows count from 1, per file)."""

    description: str
    """The file, glob, hub dataset or built-in dataset the rows came from."""
    key: str
    """The recipe key that named it ("data.path", "data.val_path", "data.name")."""
    files: tuple[str, ...] = ()
    """The files read, in the order their rows follow each other (one file: rows are its rows)."""
    rows: Optional[tuple[int, ...]] = None
    """For a subset (a validation split): the original row of each of its rows."""

    def where(self, index: int) -> str:
        if self.rows is not None:
            index = self.rows[index]
        if len(self.files) <= 1:
            return f"{self.files[0] if self.files else self.description}, row {index + 1}"
        for path, count in zip(self.files, _row_counts(self.files)):
            if index < count:
                return f"{path}, row {index + 1}"
            index -= count
        return f"{self.description}, row {index + 1}"


def _row_counts(files: Sequence[str]) -> list[int]:
    """Rows per file, counted only when an error needs a row's file (so never on the happy path)."""
    from datasets import load_dataset

    from ditty.data.sources import FILE_BUILDERS

    counts = []
    for path in files:
        builder = FILE_BUILDERS[os.path.splitext(path)[1].lower()]
        counts.append(len(load_dataset(builder, data_files=[path], split="train")))
    return counts


# ---------------------------------------------------------------------------- labels


@dataclass(frozen=True)
class LabelSpace:
    """The labels of the training data, in id order (`names[i]` is the name of id i)."""

    names: tuple[str, ...]
    seen: frozenset
    """Label values that occur in the training data (ints or strings, as written there)."""
    integer: bool
    """The data's labels are integers, used as the ids themselves."""

    def __len__(self) -> int:
        return len(self.names)

    def id_of(self, value: Any) -> Optional[int]:
        if value not in self.seen:
            return None
        return int(value) if self.integer else self.names.index(value)

    def to_json(self) -> dict[str, Any]:
        return {"names": list(self.names), "seen": sorted(self.seen, key=str), "integer": self.integer}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "LabelSpace":
        return cls(tuple(doc["names"]), frozenset(doc["seen"]), bool(doc["integer"]))

    @classmethod
    def from_values(cls, values: set, hint: Optional[Sequence[str]] = None) -> "LabelSpace":
        """From the training data's label values. `hint`: a pretrained classifier's id2label names;
        kept (so its head keeps meaning the same classes) when it is not transformers' default
        LABEL_i and covers the data's labels."""
        useful_hint = list(hint or ())
        if not useful_hint or all(_DEFAULT_LABEL.fullmatch(str(name)) for name in useful_hint):
            useful_hint = []
        if all(isinstance(value, int) for value in values):
            size = max(values) + 1
            names = useful_hint if len(useful_hint) >= size else [str(i) for i in range(size)]
            return cls(tuple(names), frozenset(values), True)
        if useful_hint and set(values) <= set(useful_hint):
            return cls(tuple(useful_hint), frozenset(values), False)
        return cls(tuple(sorted(values)), frozenset(values), False)


# ---------------------------------------------------------------------------- checking rows


def columns_of(data: "DataConfig") -> dict[str, str]:
    """{recipe key: column} that `data.format` reads."""
    if data.format == "classification":
        columns = {"data.text_column": data.text_column, "data.label_column": data.label_column}
        if data.text_pair_column:
            columns["data.text_pair_column"] = data.text_pair_column
        return columns
    if data.format == "token_classification":
        return {"data.words_column": data.words_column, "data.tags_column": data.tags_column}
    if data.format == "seq2seq":
        return {"data.source_column": data.source_column, "data.target_column": data.target_column}
    if data.format == "masked_lm":
        return {"data.text_column": data.text_column}
    raise ValueError(f"{data.format!r} is not a task format")


def check_rows(dataset: "Dataset", data: "DataConfig", source: RowSource) -> tuple[set, Optional[list[int]], int]:
    """Check every row of `dataset` for `data.format`; return the label values of its good rows (an
    empty set for formats without labels), the indices of the good rows when some were left out (else
    None) and how many bad rows were left out.
    Bad rows are a RecipeError naming the file and row of each (up to five), or with
    `data.on_bad_rows = "skip"` left out and counted (all of them bad is still an error)."""
    columns = columns_of(data)
    require_columns(dataset, columns, source.description, source.key)
    check = _ROW_CHECKS[data.format]
    skip = data.on_bad_rows == "skip"
    bad: list[str] = []
    bad_count, good = 0, []
    labels: set = set()
    for index, row in _rows(dataset, list(columns.values())):
        row_labels: set = set()
        problem = check(row, data, row_labels)
        if not problem:
            labels |= row_labels
            good.append(index)
            continue
        bad_count += 1
        if len(bad) < MAX_REPORTED_ROWS:
            bad.append(f"{source.where(index)}: {problem}")
        if len(bad) >= MAX_REPORTED_ROWS and not skip:
            break
    if bad and (not skip or not good):
        raise RecipeError.single(
            f'bad rows for data.format = "{data.format}"'
            + (" (every row)" if skip else "")
            + ":\n      "
            + "\n      ".join(bad),
            key=source.key,
            fix="fix or remove these rows (each needs "
            + ", ".join(f"{c!r}" for c in columns.values())
            + '), or set data.on_bad_rows = "skip" to train without them',
        )
    if bad_count:
        log.warning(
            'skipping %d bad rows of %s (data.on_bad_rows = "skip"); the first: %s',
            bad_count,
            source.description,
            bad[0],
        )
        return labels, good, bad_count
    return labels, None, 0


def check_labels_known(dataset: "Dataset", data: "DataConfig", space: LabelSpace, source: RowSource) -> None:
    """Every label of `dataset` (validation) is one training saw; else a RecipeError naming the row."""
    column = data.label_column if data.format == "classification" else data.tags_column
    for index, row in _rows(dataset, [column]):
        values = row[column] if data.format == "token_classification" else [row[column]]
        unseen = [label_value(v) for v in values if space.id_of(label_value(v)) is None]
        if unseen:
            known = ", ".join(repr(n) for n in sorted(space.seen, key=str)[:12])
            raise RecipeError.single(
                f"{source.where(index)}: label {unseen[0]!r} never occurs in the training data (labels there: {known})",
                key=source.key,
                fix="validate on labels the model was trained on: fix the row, or add that label to the training data",
            )


def _rows(dataset: "Dataset", columns: list[str]) -> Iterator[tuple[int, dict]]:
    """(index, {column: value}) of every row, read column-wise in batches (no per-row Arrow reads)."""
    index = 0
    for batch in dataset.select_columns(columns).iter(batch_size=4096):
        size = len(batch[columns[0]])
        for offset in range(size):
            yield index + offset, {column: batch[column][offset] for column in columns}
        index += size


def _text_problem(value: Any, column: str) -> Optional[str]:
    if value is None:
        return f"{column!r} is missing"
    if isinstance(value, (bool, list, dict)):
        return f"{column!r} should be text, got {type(value).__name__}"
    if not str(value).strip():
        return f"{column!r} is empty"
    return None


def label_value(value: Any) -> Any:
    """A label as the data means it: an integral float (CSV) is an int; other values as they are."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _label_problem(value: Any, column: str) -> Optional[str]:
    value = label_value(value)
    if value is None:
        return f"{column!r} is missing"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return f"{column!r} should be a string or an integer, got {type(value).__name__} {value!r}"
    if isinstance(value, int) and value < 0:
        return f"{column!r} is {value}: integer labels are class ids, 0 or more"
    if isinstance(value, str) and not value.strip():
        return f"{column!r} is empty"
    return None


def _check_classification(row: dict, data: "DataConfig", labels: set) -> Optional[str]:
    problem = _text_problem(row[data.text_column], data.text_column)
    if not problem and data.text_pair_column:
        problem = _text_problem(row[data.text_pair_column], data.text_pair_column)
    problem = problem or _label_problem(row[data.label_column], data.label_column)
    if problem is None:
        labels.add(label_value(row[data.label_column]))
    return problem


def _check_token_classification(row: dict, data: "DataConfig", labels: set) -> Optional[str]:
    words, tags = row[data.words_column], row[data.tags_column]
    for value, column in ((words, data.words_column), (tags, data.tags_column)):
        if value is None:
            return f"{column!r} is missing"
        if not isinstance(value, list):
            return f"{column!r} should be a list, got {type(value).__name__}"
    if not words:
        return f"{data.words_column!r} is empty"
    if len(words) != len(tags):
        return f"{len(words)} words but {len(tags)} tags: each word needs one tag"
    for word in words:
        if not isinstance(word, str) or not word:
            return f"{data.words_column!r} holds {word!r}: words are non-empty strings"
    for tag in tags:
        problem = _label_problem(tag, data.tags_column)
        if problem:
            return problem
    labels.update(label_value(tag) for tag in tags)
    return None


def _check_seq2seq(row: dict, data: "DataConfig", labels: set) -> Optional[str]:
    return _text_problem(row[data.source_column], data.source_column) or _text_problem(
        row[data.target_column], data.target_column
    )


def _check_masked_lm(row: dict, data: "DataConfig", labels: set) -> Optional[str]:
    return _text_problem(row[data.text_column], data.text_column)


_ROW_CHECKS: dict[str, Callable[[dict, "DataConfig", set], Optional[str]]] = {
    "classification": _check_classification,
    "token_classification": _check_token_classification,
    "seq2seq": _check_seq2seq,
    "masked_lm": _check_masked_lm,
}
