"""Turning samples into model inputs: padded micro-batches, or packed rows with an isolating mask.

Both produce {"input_ids", "labels", "attention_mask", "position_ids"} as tensors of shape [B, T]
(the packed attention mask is [B, 1, T, T]). Labels are NOT shifted (Hugging Face convention: the
loss shifts them) and are copied as given, like every collator of ditty's (ditty.data.hf's too): the
formats already give the first token of every language-model sample label -100, since nothing
predicts it. A packed row also blanks each sample's first label, so the previous sample's last
position is never asked to predict it. So `labels != -100` counts exactly the tokens that take loss.

Packed rows and transformers 5.23 (measured on a tiny LlamaForCausalLM, use_cache=False):
- A 4D mask [B, 1, T, T] is passed to the attention kernel as is (`masking_utils` returns any 4D
  tensor untouched), so it must already be in the kernel's convention. An ADDITIVE FLOAT mask
  (0 = attend, a large negative number = blocked) works for both "sdpa" and "eager", in fp32, with
  bf16 weights and under bf16 autocast. A BOOLEAN 4D mask works for sdpa but NOT for eager, which
  adds the mask to the scores (True becomes +1, nothing is blocked). Hence float.
- Position ids alone isolate samples only when no mask is given; with an all-ones 2D mask the
  samples leak into each other (logits off by 0.84 here; 1.87 in the issue report). The explicit
  block-diagonal causal mask matches one-by-one logits to ~2e-7.
- The blocked value is `finfo(float32).min`, not -inf: it may round to -inf when cast to bf16/fp16,
  so no row may be blocked entirely (softmax of all -inf is NaN). Padding positions therefore
  attend to themselves only; real tokens never see them.
- flash_attention_2 takes no 4D mask; packing needs "sdpa" or "eager".
"""

from __future__ import annotations

from typing import Sequence

import torch

from ditty._utils.labels import IGNORE_INDEX

Sample = tuple[Sequence[int], Sequence[int]]  # (input_ids, labels)

BLOCKED = torch.finfo(torch.float32).min


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


def pack_rows(rows: Sequence[Sequence[Sample]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Several samples per row, laid end to end and right-padded to the longest row.

    Position ids restart at 0 for each sample; the attention mask is block-diagonal causal (see the
    module docstring for its convention).
    """
    width = max(sum(len(ids) for ids, _ in row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    # Which sample each position belongs to; -1 marks padding.
    segment = torch.full((len(rows), width), -1, dtype=torch.long)
    for row_index, row in enumerate(rows):
        start = 0
        for sample_index, (ids, sample_labels) in enumerate(row):
            end = start + len(ids)
            input_ids[row_index, start:end] = torch.as_tensor(ids)
            labels[row_index, start + 1 : end] = torch.as_tensor(sample_labels[1:])
            position_ids[row_index, start:end] = torch.arange(len(ids))
            segment[row_index, start:end] = sample_index
            start = end
    return {
        "input_ids": input_ids,
        "labels": labels,
        "attention_mask": block_causal_mask(segment),
        "position_ids": position_ids,
    }


def block_causal_mask(segment: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] additive float mask from per-position sample ids ([B, T], -1 = padding):
    a query sees keys of its own sample at or before it; padding sees only itself."""
    width = segment.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    same_sample = (segment[:, :, None] == segment[:, None, :]) & (segment[:, :, None] >= 0)
    allowed = (same_sample & causal) | torch.eye(width, dtype=torch.bool)
    mask = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill_(~allowed, BLOCKED)
    return mask[:, None, :, :]
