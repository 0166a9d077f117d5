"""Rows of the task formats ("classification", "token_classification", "seq2seq", "masked_lm") checked
and turned into model inputs.

Every row is checked before anything is tokenized (`check_rows`): a missing field, a value of the
wrong type or an empty text is a RecipeError naming the file and row (up to five bad rows at once).
Labels are read in the same pass: `LabelSpace` is the label set of the training data, which becomes
the model config's num_labels / id2label / label2id; a validation label that training never saw is
an error naming its row.

Samples keep the tokenizer's own model inputs (`tokenizer.model_input_names`: input_ids,
attention_mask, and token_type_ids for BERT-style models, never for DistilBERT) plus:
- classification: `labels`, the class id;
- token_classification: `labels`, one per token: the tag id on the first sub-word of each word,
  -100 on the other sub-words and on special tokens (only the first sub-word is scored);
- seq2seq: `labels`, the target's token ids ending with the end-of-sequence token (the decoder
  inputs are these shifted right, made by the collator);
- masked_lm: `special_tokens_mask`; which tokens are masked is drawn per step by the collator.
Texts keep their first `data.max_seq_len` tokens (seq2seq targets their first `data.max_target_len`).

Each encoder is a module-level function bound with `functools.partial`, so `datasets` can hash it
and cache the tokenized data as it does for the causal-LM formats (ditty.data.formats).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Sequence

from ditty._utils.labels import IGNORE_INDEX
from ditty.config.errors import RecipeError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from ditty.config.sections import DataConfig

TASK_FORMATS = ("classification", "token_classification", "seq2seq", "masked_lm")
log = logging.getLogger("ditty.data")
MAX_REPORTED_ROWS = 5
_DEFAULT_LABEL = re.compile(r"LABEL_\d+")

Batch = dict[str, list[Any]]


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
    if len(dataset) == 0:
        raise RecipeError.single(
            f"{source.description} holds no rows", key=source.key, fix="point it at data with at least one sample"
        )
    columns = columns_of(data)
    found = dataset.column_names
    for key, column in columns.items():
        if column not in found:
            raise RecipeError.single(
                f"column {column!r} is missing from {source.description} (columns found: {', '.join(found) or 'none'})",
                key=key,
                fix=f"set {key} to one of the columns found, or pick the data.format that matches the data",
            )
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
        unseen = [_label_value(v) for v in values if space.id_of(_label_value(v)) is None]
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


def _label_value(value: Any) -> Any:
    """A label as the data means it: an integral float (CSV) is an int; other values as they are."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _label_problem(value: Any, column: str) -> Optional[str]:
    value = _label_value(value)
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
        labels.add(_label_value(row[data.label_column]))
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
    labels.update(_label_value(tag) for tag in tags)
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


# ---------------------------------------------------------------------------- encoding


def encode_rows(
    dataset: "Dataset",
    tokenizer: "PreTrainedTokenizerBase",
    data: "DataConfig",
    labels: Optional[LabelSpace],
    *,
    what: str,
) -> "Dataset":
    """The samples of checked rows (see the module doc); the raw columns are dropped."""
    _require_tokenizer_support(tokenizer, data)
    inputs = tuple(tokenizer.model_input_names)
    if data.format == "classification":
        encode = functools.partial(
            encode_classification,
            tokenizer=tokenizer,
            text=data.text_column,
            pair=data.text_pair_column,
            label=data.label_column,
            labels=labels,
            max_len=data.max_seq_len,
            inputs=inputs,
        )
    elif data.format == "token_classification":
        encode = functools.partial(
            encode_token_classification,
            tokenizer=tokenizer,
            words=data.words_column,
            tags=data.tags_column,
            labels=labels,
            max_len=data.max_seq_len,
            inputs=inputs,
        )
    elif data.format == "seq2seq":
        encode = functools.partial(
            encode_seq2seq,
            tokenizer=tokenizer,
            source=data.source_column,
            target=data.target_column,
            max_len=data.max_seq_len,
            max_target_len=data.max_target_len,
            inputs=inputs,
        )
    else:
        encode = functools.partial(
            encode_masked_lm, tokenizer=tokenizer, text=data.text_column, max_len=data.max_seq_len, inputs=inputs
        )
    return dataset.map(
        encode, batched=True, remove_columns=dataset.column_names, desc=f"tokenizing ({data.format}, {what})"
    )


def _require_tokenizer_support(tokenizer: "PreTrainedTokenizerBase", data: "DataConfig") -> None:
    if data.format == "token_classification" and not getattr(tokenizer, "is_fast", False):
        raise RecipeError.single(
            'data.format = "token_classification" aligns tags to sub-words with a fast tokenizer, and this one is not',
            key="tokenizer.path",
            fix="use a tokenizer with a tokenizer.json (a fast tokenizer)",
        )
    if data.format == "masked_lm" and tokenizer.mask_token_id is None:
        raise RecipeError.single(
            'data.format = "masked_lm" needs a tokenizer with a mask token, and this one has none',
            key="tokenizer.path",
            fix='use the model\'s own tokenizer (BERT-style tokenizers have [MASK]); the "byte" tokenizer has none',
        )


def _text(values: Iterable[Any]) -> list[str]:
    return [str(value) for value in values]


def _model_inputs(encoded: Any, inputs: Sequence[str]) -> Batch:
    return {name: encoded[name] for name in inputs if name in encoded}


def encode_classification(
    batch: Batch,
    *,
    tokenizer: "PreTrainedTokenizerBase",
    text: str,
    pair: Optional[str],
    label: str,
    labels: LabelSpace,
    max_len: int,
    inputs: Sequence[str],
) -> Batch:
    pairs = _text(batch[pair]) if pair else None
    encoded = tokenizer(_text(batch[text]), pairs, truncation=True, max_length=max_len)
    out = _model_inputs(encoded, inputs)
    out["labels"] = [labels.id_of(_label_value(value)) for value in batch[label]]
    return out


def encode_token_classification(
    batch: Batch,
    *,
    tokenizer: "PreTrainedTokenizerBase",
    words: str,
    tags: str,
    labels: LabelSpace,
    max_len: int,
    inputs: Sequence[str],
) -> Batch:
    encoded = tokenizer(batch[words], is_split_into_words=True, truncation=True, max_length=max_len)
    out = _model_inputs(encoded, inputs)
    out["labels"] = []
    for row, row_tags in enumerate(batch[tags]):
        aligned, previous = [], None
        for word in encoded.word_ids(row):
            first_piece = word is not None and word != previous
            aligned.append(labels.id_of(_label_value(row_tags[word])) if first_piece else IGNORE_INDEX)
            previous = word
        out["labels"].append(aligned)
    return out


def encode_seq2seq(
    batch: Batch,
    *,
    tokenizer: "PreTrainedTokenizerBase",
    source: str,
    target: str,
    max_len: int,
    max_target_len: int,
    inputs: Sequence[str],
) -> Batch:
    out = _model_inputs(tokenizer(_text(batch[source]), truncation=True, max_length=max_len), inputs)
    targets = tokenizer(text_target=_text(batch[target]), truncation=True, max_length=max_target_len)["input_ids"]
    eos = tokenizer.eos_token_id
    # The decoder must learn to stop: every target ends with eos (T5's and BART's tokenizers add it
    # themselves; a tokenizer without that post-processing, like the byte one, gets it here).
    out["labels"] = [ids if eos is None or ids[-1:] == [eos] else ids[: max_target_len - 1] + [eos] for ids in targets]
    return out


def encode_masked_lm(
    batch: Batch, *, tokenizer: "PreTrainedTokenizerBase", text: str, max_len: int, inputs: Sequence[str]
) -> Batch:
    encoded = tokenizer(_text(batch[text]), truncation=True, max_length=max_len, return_special_tokens_mask=True)
    out = _model_inputs(encoded, inputs)
    out["special_tokens_mask"] = encoded["special_tokens_mask"]
    return out
