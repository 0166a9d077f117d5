"""The interface every data format implements (one object per `data.format` value).

A format says which columns it reads, what makes one of its rows unusable, how a batch of rows
becomes tokenized samples, how samples become a micro-batch, how many tokens of a batch take loss
and whether several samples may share a row (packing). The row loader (ditty.data.sources), the
builder (ditty.data.build), the streams (ditty.data.batching, mixture, streaming) and evaluation
ask the format and never which format it is.

Samples are dicts of token lists (a `datasets` row after the format's `encoder`). A collator
turns a list of them into tensors; `positions` are the samples' places in the global order, for
formats that draw something per sample (masked LM's masks). A paired format (preference data: a
chosen and a rejected completion of one prompt) encodes both into one sample (`chosen_input_ids`,
`rejected_input_ids`, ...) and its collator pads both halves of the batch: nothing else changes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional, Sequence

import torch

from ditty._utils.labels import IGNORE_INDEX, SHIFTED_LABELS
from ditty.data.rows import RowCheck

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ditty.config.sections import DataConfig
    from ditty.data.labels import LabelSpace
    from ditty.data.task import Task

Batch = dict[str, list[Any]]


class DataFormat:
    """One `data.format` (see the module doc). Subclasses set `name` and implement the methods
    marked as required; the rest have defaults that fit token formats without labels."""

    name: ClassVar[str]
    packable: ClassVar[bool] = False
    """Several samples may share a row (causal attention, labels already shifted per sample)."""
    labels: ClassVar[bool] = False
    """The training rows define a label set (the model's num_labels / id2label)."""
    tokenized: ClassVar[bool] = True
    """Rows become token samples (the model takes input_ids); else the rows are the samples (images)."""
    builtin_only: ClassVar[bool] = False
    """Read only from a built-in dataset, whose `data.name` implies the format (not a `data.format` value)."""

    def columns(self, data: "DataConfig") -> dict[str, str]:
        """{recipe key: column} this format reads (required)."""
        raise NotImplementedError

    def columns_found(self, data: "DataConfig", found: Sequence[str]) -> dict[str, str]:
        """{recipe key: column} this format reads from data with the `found` columns (a format that
        recognises several layouts picks the one the data has)."""
        return self.columns(data)

    def row_check(self, data: "DataConfig") -> RowCheck:
        """What the row loader checks in each row (required)."""
        raise NotImplementedError

    def read_builtin(self, data: "DataConfig", seed: int) -> Any:
        """The rows of the built-in dataset `data.name` in this format (ditty.data.build.SourceRows)."""
        from ditty.data.build import builtin_rows

        return builtin_rows(data)

    def check_tokenizer(self, tokenizer: "PreTrainedTokenizerBase", data: "DataConfig") -> None:
        """A RecipeError when the tokenizer lacks what the format needs (a chat template, a mask token)."""

    def encoder(
        self, tokenizer: "PreTrainedTokenizerBase", data: "DataConfig", labels: Optional["LabelSpace"]
    ) -> Callable[[Batch], Batch]:
        """The batched `Dataset.map` function from rows to samples: a module-level function bound
        with `functools.partial`, which `datasets` can hash as the tokenization cache key (required)."""
        raise NotImplementedError

    def exact_match_task(self, dataset: Any, data: "DataConfig", tokenizer: Any = None) -> Optional["Task"]:
        """Checked validation rows as prompts and reference answers (`data.val_exact_match`), or None
        for formats without one answer per row. `tokenizer` renders chat prompts (its chat template)."""
        return None

    answers: ClassVar[bool] = False
    """Rows hold one reference answer each, so `exact_match_task` scores them (`data.val_exact_match`)."""

    def label_values(self, dataset: Any, data: "DataConfig") -> set:
        """The label values of checked rows (formats with `labels`)."""
        return set()

    def check_labels_known(self, dataset: Any, data: "DataConfig", labels: "LabelSpace", what: str, key: str) -> None:
        """A RecipeError naming the first row of `dataset` (validation) whose label training never saw."""

    def check_training_set(self, samples: Any, data: "DataConfig", key: str) -> None:
        """A warning when the tokenized training samples as a whole cannot teach what the format is
        for (KTO's examples of one label only); `key` names the data. Nothing by default."""

    def collator(self, tokenizer: "PreTrainedTokenizerBase", data: "DataConfig", **facts: Any) -> "Collator":
        """The collator of this format's samples; `facts`: what the model says (its decoder start
        token), `seed`: the data seed."""
        return PaddingCollator(pad_token_id=tokenizer.pad_token_id, max_seq_len=data.max_seq_len)


class Collator:
    """Samples -> one micro-batch of tensors."""

    tokenized: ClassVar[bool] = True
    """Batches are token rows (the model takes input_ids); else the samples themselves (images)."""

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, Any]:
        raise NotImplementedError

    def pack(self, rows: Sequence[Sequence[dict]]) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} does not pack samples")

    def blank(self, batch: Any) -> Any:
        """`batch` with nothing in it taking loss (the filler batch of a rank short of validation samples)."""
        batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
        return batch

    def for_validation(self) -> "Collator":
        """The collator of validation batches (the same, unless it draws something per sample)."""
        return self

    def supervised_count(self, batch: dict) -> torch.Tensor:
        """Tokens (or samples) of the batch that take loss: the loss's denominator."""
        return (batch["labels"] != IGNORE_INDEX).sum()

    def input_count(self, batch: dict) -> torch.Tensor:
        """The `tokens` metric's increment: the tokens that entered the model."""
        tokens = batch["attention_mask"].sum() if "attention_mask" in batch else batch["input_ids"].numel()
        if "decoder_input_ids" in batch:  # the decoder reads one input per target token
            tokens = tokens + (batch["labels"] != IGNORE_INDEX).sum()
        return torch.as_tensor(tokens)


@dataclass(frozen=True)
class PaddingCollator(Collator):
    """Causal-LM samples ({"input_ids", "labels"}): padded, or packed several to a row (ditty.data.collate)."""

    pad_token_id: int
    max_seq_len: Optional[int] = None

    def _pairs(self, samples: Sequence[dict]) -> list:
        limit = self.max_seq_len
        return [(list(s["input_ids"])[:limit], list(s["labels"])[:limit]) for s in samples]

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, Any]:
        from ditty.data.collate import pad_samples

        return pad_samples(self._pairs(samples), self.pad_token_id)

    def pack(self, rows: Sequence[Sequence[dict]]) -> dict[str, Any]:
        from ditty.data.collate import pack_rows

        return pack_rows([self._pairs(row) for row in rows], self.pad_token_id)

    def supervised_count(self, batch: dict) -> torch.Tensor:
        if SHIFTED_LABELS in batch:  # a context-parallel slice (ditty.data.context_shard)
            return (batch[SHIFTED_LABELS] != IGNORE_INDEX).sum()
        # Labels are unshifted, so position 0 never takes loss (CausalLMLoss shifts the same way).
        return (batch["labels"][..., 1:] != IGNORE_INDEX).sum()

    def input_count(self, batch: dict) -> torch.Tensor:
        # Packed rows have no attention mask: their padding is pad ids at the end of each row.
        mask = batch.get("attention_mask")
        return mask.sum() if mask is not None else (batch["input_ids"] != self.pad_token_id).sum()


CUT_PROBLEM = "cut_problem"
"""A column an encoder may add: why the cut to `data.max_seq_len` leaves a sample unusable ("" when it
does not), such as a pair whose two sides become the same. `tokenize` refuses such samples or, with
`data.on_bad_rows = "skip"`, leaves them out and counts them as bad rows."""


def cut_problem_text(what: str, text: Any) -> str:
    """`what` and the start of the row's text, so that the sample can be found in the data."""
    shown = repr(text if isinstance(text, str) else str(text))
    return f"{what} ({shown if len(shown) <= 60 else shown[:57] + '...'})"


def bound(function: Callable, **arguments: Any) -> Callable[[Batch], Batch]:
    """`function` with its keyword arguments bound, hashable by `datasets` (its map cache key)."""
    return functools.partial(function, **arguments)


def model_inputs(encoded: Any, inputs: Sequence[str]) -> Batch:
    """The tokenizer's model inputs of an encoding (input_ids, attention_mask, token_type_ids...)."""
    return {name: encoded[name] for name in inputs if name in encoded}


def as_text(values: Sequence[Any]) -> list[str]:
    """Column values as strings: CSV and JSON readers type "59" as a number, and an empty cell is None."""
    return ["" if value is None else str(value) for value in values]


def text_problem(value: Any, column: str) -> Optional[str]:
    """Why a text a task reads is unusable (not text, or empty), or None."""
    if isinstance(value, (bool, list, dict)):
        return f"{column!r} should be text, got {type(value).__name__}"
    if not str(value).strip():
        return f"{column!r} is empty"
    return None
