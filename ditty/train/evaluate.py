"""Validation: token-weighted loss over the whole validation set, plus the task's own metrics.

The validation set is read in its stored order, padded per micro-batch (no packing, no shuffling),
and split among ranks by index, so every sample counts exactly once whatever the world size.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch

from ditty._utils.dist import rank as get_rank
from ditty._utils.dist import world_size as get_world_size
from ditty._utils.labels import IGNORE_INDEX
from ditty.data.collate import pad_samples
from ditty.train.step import all_reduce_sum


def eval_batches(dataset: Any, micro_batch_size: int, pad_token_id: int) -> Iterator[dict]:
    """This rank's share of the validation set, in order, as padded micro-batches.

    Every rank yields the same number of batches: under FSDP each forward is a collective, so a
    rank with one batch fewer would leave the others waiting. A rank short of samples runs its last
    batch again with every label ignored (it adds no tokens and no loss).
    """
    rank, world = get_rank(), get_world_size()
    indices = list(range(rank, len(dataset), world))
    per_rank = -(-len(dataset) // world)  # the largest share
    batches = -(-per_rank // micro_batch_size)
    for number in range(batches):
        chunk = indices[number * micro_batch_size : (number + 1) * micro_batch_size]
        if chunk:
            yield pad_samples(_fetch(dataset, chunk), pad_token_id)
        elif len(dataset):
            batch = pad_samples(_fetch(dataset, [0]), pad_token_id)
            batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
            yield batch


def _fetch(dataset: Any, indices: list[int]) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of the rows; one columnar read for a datasets.Dataset (not one per row)."""
    if hasattr(dataset, "column_names"):
        columns = dataset[indices]
        return list(zip(columns["input_ids"], columns["labels"]))
    return [(dataset[i]["input_ids"], dataset[i]["labels"]) for i in indices]


@torch.no_grad()
def validation_loss(
    forward: Callable[[dict], Any],
    batches: Iterator[dict],
    count_fn: Callable[[dict], torch.Tensor],
) -> Optional[float]:
    """Sum of token losses over all batches (and ranks) / number of supervised tokens.

    `forward(batch)` returns the loss calculator's LossOutput. Losses that return a mean are
    weighted by their batch's supervised-token count. Cost: one all-reduce and one host sync at the end.
    """
    loss_sum = torch.zeros((), dtype=torch.float64)
    tokens = torch.zeros((), dtype=torch.float64)
    for batch in batches:
        out = forward(batch)
        if out.num_tokens is not None:
            loss_sum += out.loss.detach().double().cpu()
            tokens += torch.as_tensor(out.num_tokens).double().cpu()
        else:
            n = torch.as_tensor(count_fn(batch)).double().cpu()
            if n == 0:  # a filler batch (see eval_batches): a mean over no tokens is NaN
                continue
            loss_sum += out.loss.detach().double().cpu() * n
            tokens += n
    totals = all_reduce_sum(torch.stack([loss_sum, tokens]))
    if totals[1] == 0:
        return None
    return float(totals[0] / totals[1])
