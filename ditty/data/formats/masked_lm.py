"""The "masked_lm" format: a text, of which the collator masks tokens (BERT's rule).

Samples keep the tokenizer's model inputs and `special_tokens_mask`. Of `data.mask_probability` of
the non-special tokens, 80% become the mask token, 10% a random token, 10% stay; labels hold the
original ids there and -100 elsewhere. Masking is drawn from a generator seeded by (seed, the
sample's position in the global order), so the same step masks the same tokens on any world size
and after a resume; validation samples are masked the same way at every evaluation (seeded by their
index), so val_loss curves compare.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import torch

from ditty._utils.labels import IGNORE_INDEX
from ditty.config.errors import RecipeError
from ditty.data.formats.base import Batch, Collator, DataFormat, RowCheck, as_text, bound, model_inputs, text_problem
from ditty.data.rows import ANY

if TYPE_CHECKING:
    from ditty.config.sections import DataConfig

VALIDATION_MASK_SEED = 1_000_003
"""Mixed into the seed of validation masks, so they differ from the training masks of the same index."""


class MaskedLMFormat(DataFormat):
    name = "masked_lm"

    def columns(self, data: "DataConfig") -> dict[str, str]:
        return {"data.text_column": data.text_column}

    def row_check(self, data: "DataConfig") -> RowCheck:
        column = data.text_column
        return RowCheck({column: ANY}, lambda row: text_problem(row[column], column))

    def check_tokenizer(self, tokenizer: Any, data: "DataConfig") -> None:
        if tokenizer.mask_token_id is None:
            raise RecipeError.single(
                'data.format = "masked_lm" needs a tokenizer with a mask token, and this one has none',
                key="tokenizer.path",
                fix='use the model\'s own tokenizer (BERT-style tokenizers have [MASK]); the "byte" tokenizer has none',
            )

    def encoder(self, tokenizer: Any, data: "DataConfig", labels: Any = None) -> Any:
        return bound(
            encode_masked_lm,
            tokenizer=tokenizer,
            text=data.text_column,
            max_len=data.max_seq_len,
            inputs=tuple(tokenizer.model_input_names),
        )

    def collator(self, tokenizer: Any, data: "DataConfig", **facts: Any) -> "MaskingCollator":
        return MaskingCollator(
            pad_token_id=tokenizer.pad_token_id,
            mask_token_id=tokenizer.mask_token_id,
            vocab_size=len(tokenizer),
            mask_probability=data.mask_probability,
            seed=facts.get("seed", 0),
        )


@dataclass(frozen=True)
class MaskingCollator(Collator):
    pad_token_id: int
    mask_token_id: Optional[int] = None
    vocab_size: int = 0
    mask_probability: float = 0.15
    seed: int = 0

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, Any]:
        from ditty.data.collate import pad_inputs

        batch = pad_inputs(samples, self.pad_token_id)
        positions = positions if positions is not None else range(len(samples))
        special = batch.pop("special_tokens_mask").bool() | (batch["attention_mask"] == 0)
        batch["input_ids"], batch["labels"] = self.mask(batch["input_ids"], special, positions)
        return batch

    def mask(
        self, input_ids: torch.Tensor, special: torch.Tensor, positions: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        masked, labels = input_ids.clone(), torch.full_like(input_ids, IGNORE_INDEX)
        lengths = (~special).cumsum(1).argmax(1) + 1  # up to the last maskable token: never the padding
        for row, position in enumerate(positions):
            # Drawn for the sample's own length, never the batch's padded width: the same sample gets the
            # same mask in any batch, so any world size and a resumed run mask alike.
            seed = int(np.random.SeedSequence([self.seed, int(position)]).generate_state(1)[0])
            generator = torch.Generator().manual_seed(seed)
            size = int(lengths[row])
            draw = torch.rand(size, generator=generator)
            action = torch.rand(size, generator=generator)
            random_ids = torch.randint(0, self.vocab_size, (size,), generator=generator)
            ids = input_ids[row, :size]
            chosen = (draw < self.mask_probability) & ~special[row, :size]
            labels[row, :size] = torch.where(chosen, ids, IGNORE_INDEX)
            replaced = torch.where(chosen & (action < 0.8), self.mask_token_id, ids)
            masked[row, :size] = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, replaced)
        return masked, labels

    def for_validation(self) -> "MaskingCollator":
        return replace(self, seed=self.seed + VALIDATION_MASK_SEED)


def encode_masked_lm(batch: Batch, *, tokenizer: Any, text: str, max_len: int, inputs: Sequence[str]) -> Batch:
    encoded = tokenizer(as_text(batch[text]), truncation=True, max_length=max_len, return_special_tokens_mask=True)
    out = model_inputs(encoded, inputs)
    out["special_tokens_mask"] = encoded["special_tokens_mask"]
    return out
