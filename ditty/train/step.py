"""The arithmetic of one optimizer step: token counts, loss normalisation, gradient norm, finiteness.

docs/ARCHITECTURE.md fixes the loss as the mean over supervised tokens of the whole global batch. Because
`BatchStream.next_step()` hands over every micro-batch of a step at once, the supervised tokens of
all of them are counted *before* the first forward, all-reduced across ranks, and each micro-batch
backwards `its token sum / global count`. Any cut of the same global batch (1x8, 2x4, 8x1) then
gives the same loss and the same gradients, unlike the mean of micro-batch means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist

from ditty.data.generic import batch_samples


def all_reduce_sum(t: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum across ranks (a no-op on one process): the whole world, or `group` (under tensor parallel,
    the ranks that hold different tokens: `Runtime.batch_group`). Cost: one collective, no host sync."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


@dataclass
class LossNormaliser:
    """Turns each micro-batch's loss into its share of the global-batch loss before backward.

    `world_size` undoes the mean that DDP/FSDP apply when they reduce gradients: every rank backwards
    `local_sum * world / global_tokens`, their average is `sum_over_ranks(local_sum) / global_tokens`.
    Under tensor parallel the ranks of a tensor-parallel group hold the same tokens: `world_size` and
    the count's `group` are then the ranks that hold different ones (`Runtime.batch_ranks`,
    `Runtime.batch_group`), over which FSDP2 averages.
    """

    global_tokens: torch.Tensor
    """Supervised tokens of the whole global batch (all micro-batches, all ranks), float."""
    local_samples: int
    """Rows in this rank's micro-batches of the step (for losses that return a mean)."""
    world_size: int = 1

    @classmethod
    def for_step(cls, micro_batches: list[dict], count_fn, world_size: int = 1, group: Any = None) -> "LossNormaliser":
        local = torch.stack([torch.as_tensor(count_fn(mb)) for mb in micro_batches]).sum()
        # Summing the counts on the host would be one sync per micro-batch; stay on the device.
        global_tokens = all_reduce_sum(local.to(torch.float64), group).clamp_min(1)
        local_samples = sum(batch_samples(mb) for mb in micro_batches)
        return cls(global_tokens=global_tokens, local_samples=local_samples, world_size=world_size)

    def scale(self, loss: torch.Tensor, num_tokens: Any, micro_samples: int) -> torch.Tensor:
        """The micro-batch's contribution to the global loss (what to backward)."""
        if num_tokens is not None:
            # loss is a SUM over num_tokens supervised tokens.
            return loss * (self.world_size / self.global_tokens.to(loss.device, torch.float32))
        # loss is a mean over the micro-batch: weight it by the micro-batch's share of samples.
        return loss * (micro_samples / self.local_samples)


def grad_norm(parameters: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """Total L2 norm of the gradients (a device tensor: reading it is a host sync)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False, foreach=None)


def clip_grads(parameters: Iterable[torch.nn.Parameter], max_norm: Optional[float], total_norm: torch.Tensor) -> None:
    """Scale gradients down to `max_norm` (no-op when clipping is off). Reuses the norm already computed."""
    if max_norm is None or max_norm <= 0:
        return
    # torch takes the parameters (it reads and scales their .grad); given the gradients themselves it
    # would find no .grad on them and silently clip nothing.
    torch.nn.utils.clip_grads_with_norm_(
        [p for p in parameters if p.grad is not None], max_norm, total_norm, foreach=None
    )


@dataclass
class StepOutput:
    """What one optimizer step produced, already on the host (read at log time)."""

    loss: float
    grad_norm: float
    tokens: int
    """Non-padding tokens that entered the model on this rank during the step."""
    supervised_tokens: int
    """Supervised tokens of the global batch (the loss's denominator)."""
    skipped: bool = False
    skip_reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    """Extra scalars from the loss calculator, averaged over micro-batches."""

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


def mean_across_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """The loss calculator's extra metrics averaged over ranks (one all-reduce; none without extras)."""
    if not metrics or not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    values /= dist.get_world_size()
    return dict(zip(keys, values.tolist()))
