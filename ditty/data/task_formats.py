"""Checked rows of the task formats ("classification", "token_classification", "seq2seq",
"masked_lm") turned into model inputs (the checks and the label set: ditty.data.task_rows).

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
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from ditty._utils.labels import IGNORE_INDEX
from ditty.config.errors import RecipeError
from ditty.data.task_rows import LabelSpace, label_value

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from ditty.config.sections import DataConfig

Batch = dict[str, list[Any]]


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
    out["labels"] = [labels.id_of(label_value(value)) for value in batch[label]]
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
            aligned.append(labels.id_of(label_value(row_tags[word])) if first_piece else IGNORE_INDEX)
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
