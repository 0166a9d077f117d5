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

from typing import Any, Iterator, Optional, Sequence

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
    # Flat Python lists made into tensors once: writing each sample into a tensor slice cost about
    # 35 us a sample (3.5 ms a step at 8 rows of 12 addition samples, 3-4% of a 2-thread CPU step of
    # a 3.4M-parameter model; BENCHMARKS.md, issue 43); this costs about a tenth of it.
    input_ids: list[int] = []
    labels: list[int] = []
    position_ids: list[int] = []
    lengths: list[int] = []
    for row in rows:
        used = 0
        for ids, sample_labels in row:
            input_ids.extend(ids)
            labels.append(IGNORE_INDEX)  # nothing in the row predicts a sample's first token
            labels.extend(sample_labels[1:])
            position_ids.extend(range(len(ids)))
            lengths.append(len(ids))
            used += len(ids)
        if used < width:  # the padding tail: a segment of its own
            input_ids.extend([pad_token_id] * (width - used))
            labels.extend([IGNORE_INDEX] * (width - used))
            position_ids.extend(range(width - used))
            lengths.append(width - used)
    shape = (len(rows), width)
    if not len(input_ids) == len(labels) == shape[0] * shape[1]:
        raise ValueError("every packed sample needs as many labels as input ids")
    cu_seq_lens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seq_lens[1:] = torch.tensor(lengths).cumsum(0)
    longest = max(lengths)
    return {
        "input_ids": torch.tensor(input_ids, dtype=torch.long).view(shape),
        "labels": torch.tensor(labels, dtype=torch.long).view(shape),
        "position_ids": torch.tensor(position_ids, dtype=torch.long).view(shape),
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": longest,
        "max_length_k": longest,
    }


# ---------------------------------------------------------------------------- tokenizer inputs

PADDED_WITH_ZERO = ("attention_mask", "token_type_ids", "special_tokens_mask")


def pad_inputs(samples: Sequence[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """The tokenizer's columns of every sample (not `labels`), right-padded to the longest in the
    batch: input_ids with the pad id, masks and token types with 0."""
    batch = {}
    for key in samples[0]:
        if key == "labels":
            continue
        batch[key] = pad_lists([sample[key] for sample in samples], pad_token_id if key == "input_ids" else 0)
    if "attention_mask" not in batch:
        batch["attention_mask"] = pad_lists([[1] * len(sample["input_ids"]) for sample in samples], 0)
    return batch


def pad_lists(rows: Sequence[Sequence[int]], fill: int) -> torch.Tensor:
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


# ---------------------------------------------------------------------------- reading samples


def fetch_rows(dataset: Any, indices: Sequence[int]) -> list[dict]:
    """Samples as dicts; one columnar read for a `datasets.Dataset` (not one Arrow read per row)."""
    if not len(indices):
        return []
    if hasattr(dataset, "column_names"):
        columns = dataset[list(indices)]
        return [{key: values[i] for key, values in columns.items()} for i in range(len(indices))]
    return [dataset[i] for i in indices]


def eval_batches(dataset: Any, micro_batch_size: int, collator: Any) -> Iterator[dict]:
    """This rank's share of a validation set (indices rank, rank + world, ...), in order, collated.

    Every rank yields the same number of batches: under FSDP each forward is a collective, so a rank
    with one batch fewer would leave the others waiting. A rank short of samples repeats the first
    sample with every label ignored, which adds nothing to any metric. Samples are handed their index
    as their position (masked LM: the same masks at every evaluation).
    """
    from ditty._utils.dist import batch_shard

    rank, world = batch_shard()  # a tensor-parallel group reads the same batches
    indices = list(range(rank, len(dataset), world))
    per_rank = -(-len(dataset) // world)  # the largest share
    for number in range(-(-per_rank // micro_batch_size)):
        chunk = indices[number * micro_batch_size : (number + 1) * micro_batch_size]
        if chunk:
            yield collator(fetch_rows(dataset, chunk), chunk)
        elif len(dataset):
            yield collator.blank(collator(fetch_rows(dataset, [0]), [0]))
