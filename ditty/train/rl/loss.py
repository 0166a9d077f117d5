"""The GRPO loss calculator: the pipeline's loss stage for `[rl] kind = "grpo"`.

It reads a rollout micro-batch (ditty.train.rl.rollouts), takes the policy's token log-probabilities
from the output head's input (ditty.objectives.logprobs: no full logits), and returns the SUM of
`grpo_loss` over the micro-batch with `count_tokens` as its denominator, so the trainer's own
normaliser (ditty.train.step.LossNormaliser) divides by the count of the whole global batch:
sequences for "grpo" and "dr_grpo" (whose sum is already over max_new_tokens), scored tokens for
"dapo". Any split of the batch over micro-batches and ranks gives the same loss and gradients.

Its metrics (clip fractions, KL) are each micro-batch's share of the global value, scaled by the
number of micro-batches and ranks because the trainer averages loss metrics over both; the rollout
metrics (rewards, lengths) ride along on every micro-batch unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from ditty._utils.labels import IGNORE_INDEX
from ditty.objectives.grpo import grpo_loss, loss_mask
from ditty.objectives.logprobs import token_logps
from ditty.stages.fused_loss import HEAD_INPUT, head_projection, output_head
from ditty.stages.fused_loss.head import model_config
from ditty.stages.loss import LossCalculator, LossOutput


def sampling_projection(projection: Any, rl: Any) -> Any:
    """The head as the rollouts sampled from it: logits divided by `rl.temperature` (as TRL), so the
    policy gradient and the ratios are those of the sampling distribution. (With a softcap the
    division comes before the cap.)"""
    if rl.temperature == 1.0:
        return projection
    return replace(projection, scale=projection.scale / rl.temperature)


class GRPOLoss(LossCalculator):
    """See the module doc. `rl`: the recipe's RLConfig."""

    uses_head_input = True

    def __init__(self, rl: Any, chunks: int = 8) -> None:
        super().__init__(output_index=0, target_key="labels", mask_key=None, name="grpo")
        self.rl = rl
        self.chunks = chunks

    def count_tokens(self, batch: Mapping) -> torch.Tensor:
        """This micro-batch's part of the loss's global denominator (see the module doc); the rollout
        stream counts it before it drops the rows of advantage 0 (`sequence_count`, `token_count`)."""
        if self.rl.loss == "dapo":
            if "token_count" in batch:
                return batch["token_count"]
            scored = batch["labels"][:, 1:] != IGNORE_INDEX
            if self.rl.mask_truncated:
                scored = scored & ~batch["truncated"].bool()[:, None]
            return scored.sum()
        if "sequence_count" in batch:
            return batch["sequence_count"]
        return torch.tensor(batch["advantages"].shape[0])

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        batch, model = ctx["batch"], ctx["model"]
        projection = sampling_projection(head_projection(output_head(model), model_config(model)), self.rl)
        logps, scored = token_logps(ctx[HEAD_INPUT], projection, batch["labels"], chunks=self.chunks)
        return self.from_logps(logps, scored, batch)

    def from_logps(self, logps: torch.Tensor, scored: torch.Tensor, batch: Mapping) -> LossOutput:
        """The loss of a micro-batch from the policy's token log-probabilities [B, T] (aligned with
        the labels) and the scored positions."""
        rl = self.rl
        mask = loss_mask(scored, batch["truncated"], rl.mask_truncated)
        old = batch.get("old_logps")
        reference = batch.get("ref_logps")
        out = grpo_loss(
            logps,
            old.to(logps) if old is not None else None,
            batch["advantages"].to(logps.device),
            mask,
            global_sequences=1,  # a sum: the trainer divides by the global count (count_tokens)
            global_tokens=1,
            reference_logps=reference.to(logps) if reference is not None else None,
            beta=rl.beta,
            clip_low=rl.clip_low,
            clip_high=rl.clip_high,
            importance=rl.importance,
            loss=rl.loss,
            max_new_tokens=rl.max_new_tokens,
        )
        metrics: dict[str, float] = {}
        scale = float(batch.get("metric_scale", 1.0))
        for name, value in out.metrics.items():
            per_sequence = name.startswith("clip_ratio") and rl.importance == "sequence"
            count = batch.get("global_sequences" if per_sequence else "global_tokens", 1.0)
            metrics[name] = float(value) / float(count) * scale
        metrics.update(batch.get("rollout_metrics") or {})
        return LossOutput(out.loss, metrics, num_tokens=self.count_tokens(batch))
