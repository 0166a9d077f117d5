"""The MTP loss: the row's own loss plus the heads' cross-entropy, and the heads' held-out acceptance.

Loss = main + weight x sum_k w_k CE_k, with w_k proportional to decay^(k-1) and summing to 1 (decay 1:
weight / depth each, Megatron-LM's and torchtitan's mean over depths). CE_k is the mean over depth k's
supervised targets of the whole global batch (ditty.models.mtp.targets): the loss declares them as
units (`count_units`), the trainer sums them over micro-batches and ranks before the first forward, and
each micro-batch adds its share. The main loss keeps its own form (a token sum over its global count),
so any split of a global batch gives the same loss and gradients, and with weight 0 the loss and every
gradient are the main loss's bit for bit.

Every head is scored through the chunked cross-entropy (ditty.stages.fused_loss): no [batch, length,
vocab] logits exist for any depth, whatever `train.loss_chunks` (0 scores each depth in one chunk of
its supervised tokens).

At evaluation the loss returns the main loss alone (val_loss stays the model's own) and tallies, per
depth, the cross-entropy and the draft acceptance: the share of depth k's scored positions whose greedy
token equals the main head's greedy token at that position (the main head at t + k predicts the token
depth k drafts at t), what a greedy speculative decoder verifying one draft would accept, given the
true prefix. `held_out.result` turns the tallies into `val_mtp_loss/k` and `val_mtp_acceptance/k`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable

import torch

from ditty._utils.labels import IGNORE_INDEX
from ditty.models.mtp.heads import heads_of, run_depths
from ditty.models.mtp.targets import depth_counts, depth_targets
from ditty.stages.fused_loss import (
    Projection,
    fused_linear_cross_entropy,
    half_dtype,
    head_projection,
    output_head,
    resolve_backend,
    wants_head_input,
)
from ditty.stages.fused_loss.head import model_config
from ditty.stages.loss import LossCalculator, LossOutput


def depth_weights(depth: int, decay: float) -> list[float]:
    """w_k proportional to decay^(k-1), summing to 1."""
    raw = [decay ** (k - 1) for k in range(1, depth + 1)]
    return [w / sum(raw) for w in raw]


class MTPLoss(LossCalculator):
    """`main` (the row's loss: a token sum with its count) plus the heads' loss (see the module doc)."""

    def __init__(self, main: Any, config: Any, *, chunks: int, backend: str = "auto") -> None:
        super().__init__(name=getattr(main, "name", "") or "mtp")
        self.main, self.config = main, config
        self.chunks, self.backend = max(1, chunks), backend
        self.weights = depth_weights(config.depth, config.decay)
        self.uses_head_input = wants_head_input(main)
        """The main loss's choice: the heads read the head's input either way (ditty.models.mtp.capture)."""
        self.held_out = HeldOutTally(config.depth)

    def count_units(self, batch: Mapping) -> dict[str, torch.Tensor]:
        """The main loss's supervised tokens first (the trainer's denominator), then each depth's."""
        counts = depth_counts(batch["labels"], batch.get("position_ids"), self.config.depth)
        return {"tokens": self.main.count_tokens(batch), **{f"mtp/{k}": c for k, c in enumerate(counts, start=1)}}

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        out = self.main.compute(model_output, ctx)
        model, batch = ctx["model"], ctx["batch"]
        heads = heads_of(model)
        if heads is None:
            raise RuntimeError("the MTP loss needs the model's MTP heads (ditty.models.mtp.converter attaches them)")
        trunk = heads.capture.take()
        hiddens = run_depths(heads, trunk, trunk_gradient=self.config.trunk_gradient)
        projection = self.projection(model)
        labels, positions = batch["labels"], batch.get("position_ids")
        targets = [depth_targets(labels, positions, k) for k in range(1, len(hiddens) + 1)]
        if not ctx.get("training"):
            with torch.no_grad():
                self.held_out.add(trunk.hidden, hiddens, targets, projection, self._score)
            return out
        units = ctx.get("global_units") or {}
        # StepMetrics averages a metric over micro-batches and ranks: scaled so the average is the
        # global-batch mean.
        spread = ctx.get("num_micro_steps", 1) * _world_size()
        metrics = dict(out.metrics)
        heads_loss = None
        for k, (hidden, target, weight) in enumerate(zip(hiddens, targets, self.weights), start=1):
            total, count = self._score(hidden, projection, target)
            share = total / torch.as_tensor(units.get(f"mtp/{k}", count), device=total.device).clamp_min(1).float()
            heads_loss = weight * share if heads_loss is None else heads_loss + weight * share
            metrics[f"mtp/loss/{k}"] = float(share.detach()) * spread
        metrics["mtp/loss"] = float(heads_loss.detach()) * spread
        if out.share:  # a loss over global counts: both are shares already
            return LossOutput(out.loss + self.config.weight * heads_loss, metrics, share=True)
        tokens = torch.as_tensor(units.get("tokens", out.num_tokens), device=out.loss.device).clamp_min(1)
        # The trainer divides the main sum by its global token count: the heads' share is scaled up by it.
        factor = (self.config.weight * tokens).to(heads_loss.dtype)
        return LossOutput(out.loss + factor * heads_loss, metrics, num_tokens=out.num_tokens)

    def projection(self, model: Any) -> Projection:
        """The model's output head, shared by every depth; detached when the trunk takes no gradient."""
        projection = head_projection(output_head(model), model_config(model))
        if self.config.trunk_gradient:
            return projection
        bias = projection.bias.detach() if projection.bias is not None else None
        return Projection(projection.weight.detach(), bias, projection.scale, projection.softcap)

    def _score(self, hidden: torch.Tensor, projection: Projection, target: torch.Tensor):
        backend = resolve_backend(self.backend, hidden.device.type, half_precision=half_dtype(hidden) is not None)
        return fused_linear_cross_entropy(
            hidden, projection, target, ignore_index=IGNORE_INDEX, chunks=self.chunks, backend=backend
        )


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def greedy_tokens(hidden: torch.Tensor, projection: Projection, chunks: int = 8) -> torch.Tensor:
    """argmax of the head's logits for hidden [N, H], chunk by chunk (no [N, vocab] tensor at once). A
    positive logit scale and the softcap (tanh) keep the order of the logits: the argmax ignores them."""
    out = torch.empty(hidden.shape[0], dtype=torch.long, device=hidden.device)
    size = max(1, math.ceil(hidden.shape[0] / max(1, chunks)))
    for start in range(0, hidden.shape[0], size):
        logits = torch.nn.functional.linear(hidden[start : start + size], projection.weight, projection.bias)
        out[start : start + size] = logits.argmax(-1)
    return out


class HeldOutTally:
    """Per depth, over one evaluation: the cross-entropy sum and count, and the drafts the main head
    would accept and how many were scored (see the module doc)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.reset()

    def reset(self) -> None:
        self.sums = torch.zeros(4, self.depth, dtype=torch.float64)  # loss sum, count, accepted, scored

    def add(self, trunk_hidden: torch.Tensor, hiddens: list, targets: list, projection: Projection, score: Callable):
        main_greedy = None
        for k, (hidden, target) in enumerate(zip(hiddens, targets), start=1):
            total, count = score(hidden, projection, target)
            scored = target != IGNORE_INDEX
            self.sums[0, k - 1] += float(total)
            self.sums[1, k - 1] += float(count)
            if not bool(scored.any()):
                continue
            if main_greedy is None:
                main_greedy = greedy_tokens(trunk_hidden.reshape(-1, trunk_hidden.shape[-1]), projection)
                main_greedy = main_greedy.view(trunk_hidden.shape[:-1])
            drafts = greedy_tokens(hidden[scored], projection)
            rows, columns = scored.nonzero(as_tuple=True)
            verified = main_greedy[rows, columns + k]  # the main head's token for the same position
            self.sums[2, k - 1] += float((drafts == verified).sum())
            self.sums[3, k - 1] += float(scored.sum())

    def result(self, all_reduce_sum: Callable) -> dict[str, float]:
        """The evaluation's figures (summed over ranks: collective), then the tally starts again."""
        sums = all_reduce_sum(self.sums.clone())
        self.reset()
        out: dict[str, float] = {}
        for k in range(1, self.depth + 1):
            if sums[1, k - 1] > 0:
                out[f"val_mtp_loss/{k}"] = float(sums[0, k - 1] / sums[1, k - 1])
            if sums[3, k - 1] > 0:
                out[f"val_mtp_acceptance/{k}"] = float(sums[2, k - 1] / sums[3, k - 1])
        return out


def with_mtp(loss: Any, config: Any, train: Any) -> Any:
    """The row's loss with the heads' loss added when `config.depth` > 0, else the loss itself."""
    if config.depth <= 0:
        return loss
    return MTPLoss(loss, config, chunks=train.loss_chunks, backend=train.loss_backend)
