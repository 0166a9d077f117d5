"""The "seq2seq" format: a source text and its target text, for encoder-decoder models.

Samples keep the tokenizer's model inputs of the source (its first `data.max_seq_len` tokens) plus
`labels`, the target's token ids (its first `data.max_target_len`) ending with the end-of-sequence
token. The collator pads them and adds `decoder_input_ids`: the labels shifted right behind the
model's decoder start token (what T5 and BART compute from labels inside their forward, done here
so the model is never handed labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ditty._utils.labels import IGNORE_INDEX
from ditty.data.formats.base import Batch, Collator, DataFormat, RowCheck, as_text, bound, model_inputs, text_problem
from ditty.data.rows import ANY

if TYPE_CHECKING:
    from ditty.config.sections import DataConfig


class Seq2SeqFormat(DataFormat):
    name = "seq2seq"

    def columns(self, data: "DataConfig") -> dict[str, str]:
        return {"data.source_column": data.source_column, "data.target_column": data.target_column}

    def row_check(self, data: "DataConfig") -> RowCheck:
        source, target = data.source_column, data.target_column
        return RowCheck(
            {source: ANY, target: ANY},
            lambda row: text_problem(row[source], source) or text_problem(row[target], target),
        )

    def encoder(self, tokenizer: Any, data: "DataConfig", labels: Any = None) -> Any:
        return bound(
            encode_seq2seq,
            tokenizer=tokenizer,
            source=data.source_column,
            target=data.target_column,
            max_len=data.max_seq_len,
            max_target_len=data.max_target_len,
            inputs=tuple(tokenizer.model_input_names),
        )

    def collator(self, tokenizer: Any, data: "DataConfig", **facts: Any) -> "Seq2SeqCollator":
        return Seq2SeqCollator(tokenizer.pad_token_id, facts.get("decoder_start_token_id"))


@dataclass(frozen=True)
class Seq2SeqCollator(Collator):
    pad_token_id: int
    decoder_start_token_id: Optional[int] = None
    """The model's `decoder_start_token_id`."""

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, Any]:
        from ditty.data.collate import pad_inputs, pad_lists, shift_right

        batch = pad_inputs(samples, self.pad_token_id)
        batch["labels"] = pad_lists([sample["labels"] for sample in samples], IGNORE_INDEX)
        batch["decoder_input_ids"] = shift_right(batch["labels"], self.decoder_start_token_id, self.pad_token_id)
        return batch


def encode_seq2seq(
    batch: Batch,
    *,
    tokenizer: Any,
    source: str,
    target: str,
    max_len: int,
    max_target_len: int,
    inputs: Sequence[str],
) -> Batch:
    out = model_inputs(tokenizer(as_text(batch[source]), truncation=True, max_length=max_len), inputs)
    targets = tokenizer(text_target=as_text(batch[target]), truncation=True, max_length=max_target_len)["input_ids"]
    eos = tokenizer.eos_token_id
    # The decoder must learn to stop: every target ends with eos (T5's and BART's tokenizers add it
    # themselves; a tokenizer without that post-processing, like the byte one, gets it here).
    out["labels"] = [ids if eos is None or ids[-1:] == [eos] else ids[: max_target_len - 1] + [eos] for ids in targets]
    return out
