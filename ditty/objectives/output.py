"""What every objective returns, and the one reduction rule that makes it split-invariant.

A value over the global batch is written as (sum over this split's items) / (global item count):
the trainer adds the values of every micro-batch and rank (an all-reduce SUM) and gets the value of
the whole batch, whatever the split, and the backward of each split's loss adds up to the gradient
of the whole batch's loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import torch
from torch import Tensor

Count = Union[int, float, Tensor]
"""A global count (pairs, examples, sequences, tokens), summed over micro-batches and ranks."""


@dataclass
class ObjectiveOutput:
    loss: Tensor
    """This split's share of the global-batch loss (a scalar with gradients)."""
    metrics: dict[str, Tensor] = field(default_factory=dict)
    """Detached scalars, each this split's share of the global-batch value (TRL's names)."""


def share(values: Tensor, count: Count) -> Tensor:
    """sum(values) / count: this split's share of a mean over `count` items of the global batch."""
    total = values.sum()
    if not isinstance(count, Tensor) and count <= 0:  # a tensor is not checked: that would sync the device
        raise ValueError(f"a global count must be positive, got {count}")
    return total / torch.as_tensor(count, dtype=total.dtype, device=total.device)


def detached(metrics: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: value.detach() for name, value in metrics.items()}
