"""The "token_classification" format: a list of words and one tag per word.

Samples keep the tokenizer's model inputs plus `labels`, one per token: the tag id on the first
sub-word of each word, -100 on the other sub-words and on special tokens (only the first sub-word is
scored). Aligning tags to sub-words needs a fast tokenizer (its `word_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ditty._utils.labels import IGNORE_INDEX
from ditty.config.errors import RecipeError
from ditty.data.formats.base import Batch, Collator, DataFormat, RowCheck, bound, model_inputs
from ditty.data.labels import LabelSpace, column_values, label_problem, label_value, unknown_label_error
from ditty.data.rows import ANY

if TYPE_CHECKING:
    from ditty.config.sections import DataConfig


class TokenClassificationFormat(DataFormat):
    name = "token_classification"
    labels = True

    def columns(self, data: "DataConfig") -> dict[str, str]:
        return {"data.words_column": data.words_column, "data.tags_column": data.tags_column}

    def row_check(self, data: "DataConfig") -> RowCheck:
        return RowCheck({data.words_column: ANY, data.tags_column: ANY}, lambda row: _problem(row, data))

    def check_tokenizer(self, tokenizer: Any, data: "DataConfig") -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise RecipeError.single(
                'data.format = "token_classification" aligns tags to sub-words with a fast tokenizer, and this one '
                "is not",
                key="tokenizer.path",
                fix="use a tokenizer with a tokenizer.json (a fast tokenizer)",
            )

    def encoder(self, tokenizer: Any, data: "DataConfig", labels: Optional[LabelSpace]) -> Any:
        return bound(
            encode_token_classification,
            tokenizer=tokenizer,
            words=data.words_column,
            tags=data.tags_column,
            labels=labels,
            max_len=data.max_seq_len,
            inputs=tuple(tokenizer.model_input_names),
        )

    def label_values(self, dataset: Any, data: "DataConfig") -> set:
        return {label_value(tag) for tags in column_values(dataset, data.tags_column) for tag in tags}

    def check_labels_known(self, dataset: Any, data: "DataConfig", labels: LabelSpace, what: str, key: str) -> None:
        for index, tags in enumerate(column_values(dataset, data.tags_column)):
            unseen = [label_value(tag) for tag in tags if labels.id_of(label_value(tag)) is None]
            if unseen:
                raise unknown_label_error(what, index, unseen[0], labels, key)

    def collator(self, tokenizer: Any, data: "DataConfig", **facts: Any) -> "TokenLabelsCollator":
        return TokenLabelsCollator(pad_token_id=tokenizer.pad_token_id)


def _problem(row: dict, data: "DataConfig") -> Optional[str]:
    words, tags = row[data.words_column], row[data.tags_column]
    for value, column in ((words, data.words_column), (tags, data.tags_column)):
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
        problem = label_problem(tag, data.tags_column)
        if problem:
            return problem
    return None


@dataclass(frozen=True)
class TokenLabelsCollator(Collator):
    """The tokenizer's inputs right-padded, and labels padded with -100 (one per token)."""

    pad_token_id: int

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, Any]:
        from ditty.data.collate import pad_inputs, pad_lists

        batch = pad_inputs(samples, self.pad_token_id)
        batch["labels"] = pad_lists([sample["labels"] for sample in samples], IGNORE_INDEX)
        return batch


def encode_token_classification(
    batch: Batch,
    *,
    tokenizer: Any,
    words: str,
    tags: str,
    labels: LabelSpace,
    max_len: int,
    inputs: Sequence[str],
) -> Batch:
    encoded = tokenizer(batch[words], is_split_into_words=True, truncation=True, max_length=max_len)
    out = model_inputs(encoded, inputs)
    out["labels"] = []
    for row, row_tags in enumerate(batch[tags]):
        aligned, previous = [], None
        for word in encoded.word_ids(row):
            first_piece = word is not None and word != previous
            aligned.append(labels.id_of(label_value(row_tags[word])) if first_piece else IGNORE_INDEX)
            previous = word
        out["labels"].append(aligned)
    return out
