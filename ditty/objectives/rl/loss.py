"""The policy loss stage of the RL rows (GRPO, RLOO): the clipped surrogate of ditty.objectives.rl.grpo on
a rollout micro-batch (ditty.objectives.rl.assembler).

It takes the policy's token log-probabilities from the output head's input (ditty.objectives.logprobs:
no full logits), divided by the sampling temperature. `count_units` declares the global counts the
loss is a mean over: the completions ("sequences") and their scored tokens ("tokens", without the
truncated completions' under rl.mask_truncated), the rows the assembler left out of the forward
included; the first is the loss's denominator ("sequences" for "grpo" and "dr_grpo", else "tokens").
The policy loss is `rl.loss`'s (ditty.objectives.rl.policy_losses). The trainer
sums them over every micro-batch and rank before the first forward, so `grpo_loss` runs with the
global batch's counts and returns this micro-batch's share, as do its metrics (clip fractions, KL).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ditty._utils.labels import IGNORE_INDEX
from ditty.objectives.logprobs import sampling_projection, token_logps
from ditty.objectives.rl.grpo import loss_mask
from ditty.objectives.rl.policy_losses import policy_loss_for
from ditty.stages.fused_loss import HEAD_INPUT, head_projection, output_head
from ditty.stages.fused_loss.head import model_config
from ditty.stages.loss import LossCalculator, LossOutput


class GRPOLoss(LossCalculator):
    """See the module doc. `rl`, `rollout`: the recipe's RLConfig and RolloutConfig."""

    uses_head_input = True

    def __init__(self, rl: Any, rollout: Any, chunks: int = 8) -> None:
        super().__init__(output_index=0, target_key="labels", mask_key=None, name="grpo")
        self.rl, self.rollout = rl, rollout
        self.chunks = chunks
        self.policy_loss = policy_loss_for(rl)  # rl.loss: a built-in normalisation or the user's function

    def scored_tokens(self, labels: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
        """The completion tokens that take part in the loss (rl.mask_truncated drops truncated ones)."""
        return loss_mask(labels[:, 1:] != IGNORE_INDEX, truncated, self.rl.mask_truncated).sum()

    def count_units(self, batch: Mapping) -> dict[str, torch.Tensor]:
        sequences = torch.tensor(batch["labels"].shape[0])
        tokens = self.scored_tokens(batch["labels"], batch["truncated"])
        if "idle_labels" in batch:
            sequences = sequences + batch["idle_labels"].shape[0]
            tokens = tokens + self.scored_tokens(batch["idle_labels"], batch["idle_truncated"])
        if self.rl.loss in ("grpo", "dr_grpo"):  # the first unit is the denominator: by sequence
            return {"sequences": sequences, "tokens": tokens}
        return {"tokens": tokens, "sequences": sequences}

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        batch, model = ctx["batch"], ctx["model"]
        projection = sampling_projection(
            head_projection(output_head(model), model_config(model), keep_vocab_shards=True), self.rollout.temperature
        )
        logps, scored = token_logps(ctx[HEAD_INPUT], projection, batch["labels"], chunks=self.chunks)
        return self.from_logps(logps, scored, batch, ctx["global_units"])

    def from_logps(self, logps: torch.Tensor, scored: torch.Tensor, batch: Mapping, units: Mapping) -> LossOutput:
        """The loss of a micro-batch from the policy's token log-probabilities [B, T] (aligned with
        the labels), the scored positions and the global batch's counts."""
        rl = self.rl
        mask = loss_mask(scored, batch["truncated"], rl.mask_truncated)
        old = batch.get("old_logps")
        reference = batch.get("ref_logps")
        out = self.policy_loss(
            logps,
            old.to(logps) if old is not None else None,
            batch["advantages"].to(logps.device),
            mask,
            global_sequences=units["sequences"],
            global_tokens=units["tokens"].clamp(min=1),
            reference_logps=reference.to(logps) if reference is not None else None,
            beta=rl.beta,
            clip_low=rl.clip_low,
            clip_high=rl.clip_high,
            importance=rl.importance,
            max_new_tokens=self.rollout.max_new_tokens,
            token_weights=batch["sampler_weights"].to(logps) if "sampler_weights" in batch else None,
        )
        return LossOutput(out.loss, {name: float(value) for name, value in out.metrics.items()}, share=True)
