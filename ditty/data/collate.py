"""Turning samples into model inputs: padded micro-batches, or packed rows.

Both produce {"input_ids", "labels", "position_ids"} as [B, T] tensors. Padded batches add a 2D
`attention_mask`. Packed rows add no mask at all: the cumulative sample lengths over the flattened
rows, `cu_seq_lens_q`/`cu_seq_lens_k` (int32, [samples + 1]) with `max_length_q`/`max_length_k`
(ints), under transformers' names (its DataCollatorWithFlattening writes the same); each model's
attention path turns them into what its kernel needs (ditty/models/packing.py), and no [T, T]
tensor is ever built for a model that does not need one. A row's padding tail is one more segment
(positions 0, 1, ...): it attends only to itself, and nothing attends to it.

Labels are NOT shifted (Hugging Face convention: the loss shifts them) and padded batches copy them
as given, like every collator of ditty's (ditty.compat.data's too): the formats already give the first
token of every language-model sample label -100, since nothing predicts it. A packed row also blanks
each sample's first label, so the previous sample's last position is never asked to predict it. So
`labels != -100` counts exactly the tokens that take loss.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ditty._utils.labels import IGNORE_INDEX

Sample = tuple[Sequence[int], Sequence[int]]  # (input_ids, labels)


def pad_samples(samples: Sequence[Sample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """One sample per row, right-padded to the longest in this micro-batch; 2D attention mask."""
    width = max(len(ids) for ids, _ in samples)
    input_ids = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(samples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), width), dtype=torch.long)
    for row, (ids, sample_labels) in enumerate(samples):
        input_ids[row, : len(ids)] = torch.as_tensor(ids)
        labels[row, : len(ids)] = torch.as_tensor(sample_labels)  # as given, like every collator
        attention_mask[row, : len(ids)] = 1
    position_ids = torch.arange(width).expand(len(samples), width).clone()
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask, "position_ids": position_ids}


def pack_rows(rows: Sequence[Sequence[Sample]], pad_token_id: int) -> dict[str, Any]:
    """Several samples per row, laid end to end and right-padded to the longest row; position ids
    restart at 0 for each sample and the cumulative lengths delimit the samples (module docstring)."""
    width = max(sum(len(ids) for ids, _ in row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    lengths: list[int] = []
    for row_index, row in enumerate(rows):
        start = 0
        for ids, sample_labels in row:
            end = start + len(ids)
            input_ids[row_index, start:end] = torch.as_tensor(ids)
            labels[row_index, start + 1 : end] = torch.as_tensor(sample_labels[1:])
            position_ids[row_index, start:end] = torch.arange(len(ids))
            lengths.append(len(ids))
            start = end
        if start < width:  # the padding tail: a segment of its own
            position_ids[row_index, start:] = torch.arange(width - start)
            lengths.append(width - start)
    cu_seq_lens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seq_lens[1:] = torch.cumsum(torch.tensor(lengths), 0)
    longest = max(lengths)
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": position_ids,
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": longest,
        "max_length_k": longest,
    }
