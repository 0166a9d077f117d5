"""Batches of the task formats: the collators, the training stream and the validation batches.

`TaskCollator` pads one micro-batch of samples (ditty.data.task_formats) into tensors: the
tokenizer's model inputs right-padded (input_ids with the pad id, masks and token types with 0),
`labels` padded with -100 (a [B] tensor for classification); for seq2seq also `decoder_input_ids`,
the labels shifted right behind the model's decoder start token (what T5 and BART compute from
labels inside their forward, done here so the model is never handed labels); for masked_lm the
masking itself (BERT's rule: of `mask_probability` of the non-special tokens, 80% become the mask
token, 10% a random token, 10% stay; labels hold the original ids there and -100 elsewhere).

Masking is drawn from a generator seeded by (seed, the sample's position in the global order), so
the same step masks the same tokens on any world size and after a resume; validation samples are
masked the same way at every evaluation (seeded by their index), so val_loss curves compare.

`TaskStream` is `GenericStream`'s global order (ditty.data.batching.GlobalOrder) reading rows
column-wise and handing the collator each sample's position; `task_eval_batches` is this rank's
share of the validation set, in order, with the same number of batches on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch

from ditty._utils.dist import rank as get_rank
from ditty._utils.dist import world_size as get_world_size
from ditty._utils.labels import IGNORE_INDEX
from ditty.data.batching import GlobalOrder, group_by_length, micro_batches_of_rank, sample_lengths

PADDED_WITH_ZERO = ("attention_mask", "token_type_ids", "special_tokens_mask")
VALIDATION_MASK_SEED = 1_000_003
"""Mixed into the seed of validation masks, so they differ from the training masks of the same index."""


@dataclass(frozen=True)
class TaskCollator:
    format: str
    pad_token_id: int
    decoder_start_token_id: Optional[int] = None
    """seq2seq: the model's `decoder_start_token_id`."""
    mask_token_id: Optional[int] = None
    vocab_size: int = 0
    mask_probability: float = 0.15
    seed: int = 0

    def __call__(self, samples: Sequence[dict], positions: Optional[Sequence[int]] = None) -> dict[str, torch.Tensor]:
        batch = pad_inputs(samples, self.pad_token_id)
        if self.format == "classification":
            batch["labels"] = torch.tensor([sample["labels"] for sample in samples], dtype=torch.long)
        elif self.format in ("token_classification", "seq2seq"):
            batch["labels"] = _pad([sample["labels"] for sample in samples], IGNORE_INDEX)
            if self.format == "seq2seq":
                start, pad = self.decoder_start_token_id, self.pad_token_id
                batch["decoder_input_ids"] = shift_right(batch["labels"], start, pad)
        elif self.format == "masked_lm":
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

    def for_validation(self) -> "TaskCollator":
        from dataclasses import replace

        return replace(self, seed=self.seed + VALIDATION_MASK_SEED)


def pad_inputs(samples: Sequence[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """The tokenizer's columns of every sample, right-padded to the longest in the batch."""
    batch = {}
    for key in samples[0]:
        if key == "labels":
            continue
        fill = pad_token_id if key == "input_ids" else 0
        batch[key] = _pad([sample[key] for sample in samples], fill)
    if "attention_mask" not in batch:
        batch["attention_mask"] = _pad([[1] * len(sample["input_ids"]) for sample in samples], 0)
    return batch


def _pad(rows: Sequence[Sequence[int]], fill: int) -> torch.Tensor:
    width = max(len(row) for row in rows)
    out = torch.full((len(rows), width), fill, dtype=torch.long)
    for index, row in enumerate(rows):
        out[index, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
    return out


def shift_right(labels: torch.Tensor, start_token_id: Optional[int], pad_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: the start token, then the labels without their last column
    (ignored positions read as padding), as transformers' encoder-decoder models do."""
    if start_token_id is None:
        raise ValueError("a seq2seq model needs decoder_start_token_id in its config")
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = start_token_id
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_token_id)


def fetch_rows(dataset: Any, indices: list[int]) -> list[dict]:
    """Rows as dicts; one columnar read for a `datasets.Dataset` (not one Arrow read per row)."""
    if not indices:
        return []
    if hasattr(dataset, "column_names"):
        columns = dataset[indices]
        return [{key: values[i] for key, values in columns.items()} for i in range(len(indices))]
    return [dataset[i] for i in indices]


class TaskStream(GlobalOrder):
    """Deterministic, resumable, world-size independent micro-batches of task samples (the global
    order every stream shares); optionally grouped by length like BatchStream."""

    def __init__(
        self,
        dataset: Any,
        collator: TaskCollator,
        *,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        group_lengths: bool = False,
        cursor: int = 0,
    ) -> None:
        super().__init__(
            len(dataset),
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            rank=rank,
            world_size=world_size,
            seed=seed,
            cursor=cursor,
        )
        self.dataset = dataset
        self.collator = collator
        self._lengths = sample_lengths(dataset) if group_lengths else None

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        taken = []
        for _ in range(self.global_batch_size):
            position = self.cursor
            taken.append((self._take(), position))
        out = []
        for micro in micro_batches_of_rank(taken, self):
            indices, positions = [index for index, _ in micro], [position for _, position in micro]
            out.append(self.collator(fetch_rows(self.dataset, indices), positions))
        return out

    def _arrange(self, order: np.ndarray) -> np.ndarray:
        if self._lengths is None:
            return order
        return group_by_length(order, self._lengths, self.global_batch_size)


def task_eval_batches(dataset: Any, micro_batch_size: int, collator: TaskCollator) -> Iterator[dict]:
    """This rank's share of the validation set (indices rank, rank + world, ...), in order. Every rank
    yields as many batches (a sharded forward is a collective); a rank short of samples repeats its
    first sample with every label ignored, which adds nothing to any metric. Samples are masked
    (masked_lm) by their index, the same at every evaluation."""
    rank, world = get_rank(), get_world_size()
    indices = list(range(rank, len(dataset), world))
    per_rank = -(-len(dataset) // world)
    for number in range(-(-per_rank // micro_batch_size)):
        chunk = indices[number * micro_batch_size : (number + 1) * micro_batch_size]
        if chunk:
            yield collator(fetch_rows(dataset, chunk), chunk)
        elif len(dataset):
            batch = collator(fetch_rows(dataset, [0]), [0])
            batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
            yield batch
