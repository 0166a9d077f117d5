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

from ditty._utils.dist import all_reduce_sum  # noqa: F401  (the step's collective; imported from here too)
from ditty.data.generic import batch_samples


@dataclass
class LossNormaliser:
    """Turns each micro-batch's loss into its share of the global-batch loss before backward.

    `world_size` undoes the mean that DDP/FSDP apply when they reduce gradients: every rank backwards
    `local_sum * world / global_tokens`, their average is `sum_over_ranks(local_sum) / global_tokens`.
    Under tensor parallel the ranks of a tensor-parallel group hold the same tokens: `world_size` and
    the count's `group` are then the ranks that hold different ones (`Runtime.batch_ranks`,
    `Runtime.batch_group`), over which FSDP2 averages. A loss over global counts (ditty.stages.loss)
    declares its units instead of a token count: each is summed over the whole global batch here
    (`global_units`, handed to the loss), and its share only needs the `world_size` factor.
    """

    global_tokens: torch.Tensor
    """Supervised tokens of the whole global batch (all micro-batches, all ranks), float; for a loss
    over global counts, its first unit (its denominator)."""
    local_samples: int
    """Rows in this rank's micro-batches of the step (for losses that return a mean)."""
    world_size: int = 1
    global_units: dict = field(default_factory=dict)
    """{unit: count of the whole global batch} of a loss that declares units (count_units), else empty."""

    @classmethod
    def for_step(cls, micro_batches: list[dict], count_fn, world_size: int = 1, group: Any = None) -> "LossNormaliser":
        counts = [count_fn(mb) for mb in micro_batches]
        local_samples = sum(batch_samples(mb) for mb in micro_batches)
        # Summing the counts on the host would be one sync per micro-batch; stay on the device, and
        # reduce every unit of a loss over global counts in one collective.
        if counts and isinstance(counts[0], dict):
            names = list(counts[0])
            local = torch.stack([torch.stack([torch.as_tensor(c[n]) for n in names]) for c in counts]).sum(0)
            totals = all_reduce_sum(local.to(torch.float64), group)
            units = dict(zip(names, totals.unbind()))
            return cls(totals[0].clamp_min(1), local_samples, world_size, units)
        local = torch.stack([torch.as_tensor(c) for c in counts]).sum()
        global_tokens = all_reduce_sum(local.to(torch.float64), group).clamp_min(1)
        return cls(global_tokens=global_tokens, local_samples=local_samples, world_size=world_size)

    def scale(self, out: Any, micro_samples: int) -> torch.Tensor:
        """The micro-batch's contribution to the global loss (what to backward), from its LossOutput."""
        loss = out.loss
        if out.share:  # already this micro-batch's share of the global-batch loss
            return loss * self.world_size
        if out.num_tokens is not None:
            # loss is a SUM over num_tokens supervised tokens.
            return loss * (self.world_size / self.global_tokens.to(loss.device, torch.float32))
        # loss is a mean over the micro-batch: weight it by the micro-batch's share of samples.
        return loss * (micro_samples / self.local_samples)


def as_sum(out: Any, units: Any) -> Any:
    """An evaluation's LossOutput as a sum over its count: a share computed over the batch's own units
    (`units`, a loss over global counts) is that batch's mean; anything else is returned as is."""
    if not out.share:
        return out
    from ditty.stages.loss import LossOutput

    count = next(iter(units.values()))
    return LossOutput(out.loss * count.to(out.loss.device, out.loss.dtype), out.metrics, num_tokens=count)


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


class StepMetrics:
    """The loss stage's metrics over a step's micro-batches, then across ranks: means are averaged
    (each micro-batch and rank alike), the shares of a loss over global counts are added up."""

    def __init__(self, micro_batches: int) -> None:
        self.micro_batches = micro_batches
        self.values: dict[str, float] = {}
        self.shares: set[str] = set()

    def add(self, out: Any) -> None:
        weight = 1.0 if out.share else 1.0 / self.micro_batches
        for key, value in (out.metrics or {}).items():
            self.values[key] = self.values.get(key, 0.0) + float(value) * weight
            if out.share:
                self.shares.add(key)

    def across_ranks(self, group: Any = None, ranks: Optional[int] = None) -> dict[str, float]:
        """One all-reduce over the ranks that hold different samples (none without metrics or on one
        process): `group` of `ranks` processes, the run's data-parallel ranks (under tensor parallel the
        ranks of a tensor-parallel group hold the same samples and would count them twice); None: all."""
        metrics = self.values
        if not metrics or not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return dict(metrics)
        keys = sorted(metrics)
        values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
        world = ranks if ranks is not None else dist.get_world_size(group)
        return {k: v if k in self.shares else v / world for k, v in zip(keys, values.tolist())}
