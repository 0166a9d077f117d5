"""The "classification" format: a text (and optionally a second text of a pair) and its label.

Samples keep the tokenizer's own model inputs (`tokenizer.model_input_names`: input_ids,
attention_mask, and token_type_ids for BERT-style models, never for DistilBERT) plus `labels`, the
class id. Texts keep their first `data.max_seq_len` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from ditty.data.formats.base import Batch, Collator, DataFormat, RowCheck, as_text, bound, model_inputs, text_problem
from ditty.data.labels import LabelSpace, column_values, label_problem, label_value, unknown_label_error
from ditty.data.rows import ANY

if TYPE_CHECKING:
    from ditty.config.sections import DataConfig


class ClassificationFormat(DataFormat):
    name = "classification"
    labels = True

    def columns(self, data: "DataConfig") -> dict[str, str]:
        columns = {"data.text_column": data.text_column, "data.label_column": data.label_column}
        if data.text_pair_column:
            columns["data.text_pair_column"] = data.text_pair_column
        return columns

    def row_check(self, data: "DataConfig") -> RowCheck:
        texts = [data.text_column] + ([data.text_pair_column] if data.text_pair_column else [])

        def problem(row: dict) -> Optional[str]:
            for column in texts:
                if text_problem(row[column], column):
                    return text_problem(row[column], column)
            return label_problem(row[data.label_column], data.label_column)

        return RowCheck({**{column: ANY for column in texts}, data.label_column: ANY}, problem)

    def encoder(self, tokenizer: Any, data: "DataConfig", labels: Optional[LabelSpace]) -> Any:
        return bound(
            encode_classification,
            tokenizer=tokenizer,
            text=data.text_column,
            pair=data.text_pair_column,
            label=data.label_column,
            labels=labels,
            max_len=data.max_seq_len,
            inputs=tuple(tokenizer.model_input_names),
        )

    def label_values(self, dataset: Any, data: "DataConfig") -> set:
        return {label_value(value) for value in column_values(dataset, data.label_column)}

    def check_labels_known(self, dataset: Any, data: "DataConfig", labels: LabelSpace, what: str, key: str) -> None:
        for index, value in enumerate(column_values(dataset, data.label_column)):
            if labels.id_of(label_value(value)) is None:
                raise unknown_label_error(what, index, label_value(value), labels, key)

    def collator(self, tokenizer: Any, data: "DataConfig", **facts: Any) -> "ClassCollator":
        return ClassCollator(pad_token_id=tokenizer.pad_token_id)


@dataclass(frozen=True)
class ClassCollator(Collator):
    """The tokenizer's inputs right-padded (input_ids with the pad id, masks and token types with 0),
    one label per sample ([B]); the loss's denominator counts samples."""

    pad_token_id: int

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, Any]:
        from ditty.data.collate import pad_inputs

        batch = pad_inputs(samples, self.pad_token_id)
        batch["labels"] = torch.tensor([sample["labels"] for sample in samples], dtype=torch.long)
        return batch


def encode_classification(
    batch: Batch,
    *,
    tokenizer: Any,
    text: str,
    pair: Optional[str],
    label: str,
    labels: LabelSpace,
    max_len: int,
    inputs: Sequence[str],
) -> Batch:
    pairs = as_text(batch[pair]) if pair else None
    encoded = tokenizer(as_text(batch[text]), pairs, truncation=True, max_length=max_len)
    out = model_inputs(encoded, inputs)
    out["labels"] = [labels.id_of(label_value(value)) for value in batch[label]]
    return out
