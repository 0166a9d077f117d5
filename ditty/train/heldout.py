"""Validation over several named held-out sets ([[data.sources]] and [data.eval]), each reported
on its own: `val_loss/NAME`, and `val_loss` over all of them together (token-weighted, as one set)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ditty.train.evaluate import eval_batches, validation_loss
from ditty.train.step import all_reduce_sum


@torch.no_grad()
def held_out_losses(
    forward: Callable[[dict], Any],
    val_sets: Sequence[tuple[str, Any]],
    micro_batch_size: int,
    pad_token_id: int,
    count_fn: Callable[[dict], torch.Tensor],
) -> dict[str, float]:
    """{"val_loss/NAME": loss of each set, "val_loss": all sets together}. Collective: every rank
    runs every set (its share of the samples, as `eval_batches` splits them)."""
    metrics: dict[str, float] = {}
    weighted, total = 0.0, 0.0
    for name, dataset in val_sets:
        if dataset is None or len(dataset) == 0:
            continue
        tokens = torch.zeros((), dtype=torch.float64)

        def counting(batch: dict) -> Any:
            nonlocal tokens
            tokens += torch.as_tensor(count_fn(batch)).double().cpu()
            return forward(batch)

        loss = validation_loss(counting, eval_batches(dataset, micro_batch_size, pad_token_id), count_fn)
        count = float(all_reduce_sum(tokens.reshape(1))[0])
        if loss is None or count == 0:
            continue
        metrics[f"val_loss/{name}"] = loss
        weighted += loss * count
        total += count
    if total:
        metrics["val_loss"] = weighted / total
    return metrics
