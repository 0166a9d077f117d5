"""The assembler: a scored `RolloutBatch` -> this rank's training micro-batches.

Each row is prompt + completion, collated as the causal LM's samples are (ditty.data.collate:
right-padded, labels on the completion tokens, its end-of-sequence token included); a completion
token the environment wrote (`trainable` False) gets no label, so it takes no loss and no gradient.
Beside the collated tensors a micro-batch carries, per row, `advantages` (per token under per-turn
credit, aligned with `labels` as the loss's token log-probabilities are) and `truncated`, and where
the loss needs them the log-probabilities the policy sampled with (`old_logps`, when a rollout serves
several updates) and the reference's (`ref_logps`, when rl.beta > 0), scored by the training forward's
own path so an on-policy ratio is exactly 1.

With rl.beta = 0, the rows of advantage 0 (every row of a group whose completions scored alike) are
left out of the forward: their loss and gradient are exactly 0. Their labels and truncation flags
stay in the micro-batch as `idle_labels` and `idle_truncated`, so the loss counts them in the global
denominator as if they were there (ditty.objectives.rl.loss: `count_units`); at least one row stays,
so every rank runs the same forwards.

When the sampler reported its log-probabilities (a vLLM backend), the rows are scored by the policy
too (one forward without gradients, shared with `old_logps` when a rollout serves several updates):
`assemble` returns, beside the micro-batches, the sampler/trainer mismatch of the rows that train
(ditty.objectives.sampling.correction), and with rollout.sampler_correction each micro-batch carries the
correction's `sampler_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ditty._utils.labels import IGNORE_INDEX
from ditty.data.collate import pad_samples
from ditty.objectives.sampling.batch import RolloutBatch
from ditty.objectives.sampling.correction import correction_weights, mismatch_totals

Scorer = Callable[[dict], torch.Tensor]
"""micro-batch -> token log-probabilities [rows, width] aligned with its labels."""


@dataclass
class Assembled:
    batches: list[dict]
    """This rank's training micro-batches."""
    mismatch: Optional[torch.Tensor] = None
    """[sum of |logp_trainer - logp_sampler|, tokens, max] over the rows that train (float64), when the
    sampler reported log-probabilities; None otherwise."""


class Assembler:
    def __init__(
        self,
        rl: Any,
        rollout: Any,
        *,
        pad_token_id: int,
        micro_batch_size: int,
        policy_logps: Optional[Scorer] = None,
        reference_logps: Optional[Scorer] = None,
    ) -> None:
        self.rl, self.rollout = rl, rollout
        self.pad_token_id = pad_token_id
        self.micro_batch_size = micro_batch_size
        self.policy_logps, self.reference_logps = policy_logps, reference_logps

    def __call__(self, rollouts: RolloutBatch, drop_idle: bool = True) -> list[dict]:
        return self.assemble(rollouts, drop_idle).batches

    def assemble(self, rollouts: RolloutBatch, drop_idle: bool = True) -> Assembled:
        batches = [self.collate(rollouts, start) for start in range(0, len(rollouts), self.micro_batch_size)]
        if drop_idle and self.rl.beta == 0:
            batches = [without_idle_rows(batch) for batch in batches]
        mismatch = torch.zeros(3, dtype=torch.float64) if rollouts.sampler_logps is not None else None
        for batch in batches:
            sampled = batch.pop("sampler_logps", None)
            trainer = None
            if self.rl.updates_per_rollout > 1 or sampled is not None:
                trainer = self.policy_logps(batch).cpu()
            if self.rl.updates_per_rollout > 1:
                batch["old_logps"] = trainer
            if sampled is not None:
                mask = batch["labels"] != IGNORE_INDEX
                totals = mismatch_totals(trainer, sampled, mask)
                mismatch[:2] += totals[:2]
                mismatch[2] = torch.maximum(mismatch[2], totals[2])
                if self.rollout.sampler_correction != "none":
                    batch["sampler_weights"] = correction_weights(
                        trainer, sampled, mask, self.rollout.sampler_correction, self.rollout.correction_cap
                    )
            if self.rl.beta > 0:
                batch["ref_logps"] = self.reference_logps(batch).cpu()
        return Assembled(batches, mismatch)

    def collate(self, rollouts: RolloutBatch, start: int) -> dict:
        rows = range(start, min(start + self.micro_batch_size, len(rollouts)))
        samples = []
        for i in rows:
            prompt, completion = rollouts.prompt_ids[i], rollouts.completion_ids[i]
            trainable = rollouts.trainable[i] if rollouts.trainable is not None else [True] * len(completion)
            labels = [IGNORE_INDEX] * len(prompt) + [
                t if mine else IGNORE_INDEX for t, mine in zip(completion, trainable)
            ]
            samples.append((prompt + completion, labels))
        batch = pad_samples(samples, self.pad_token_id)
        del batch["position_ids"]  # right-padded rows: the model's own positions are these
        advantages = rollouts.advantages[start : start + len(samples)].to(torch.float32)
        if advantages.dim() == 2:  # per token: aligned with the labels, as the loss's log-probabilities are
            per_token = torch.zeros(batch["labels"].shape, dtype=torch.float32)
            for row, i in enumerate(rows):
                begin, count = len(rollouts.prompt_ids[i]), len(rollouts.completion_ids[i])
                per_token[row, begin : begin + count] = advantages[row, :count]
            advantages = per_token
        batch["advantages"] = advantages
        batch["truncated"] = torch.tensor([rollouts.truncated[i] for i in rows], dtype=torch.bool)
        if rollouts.sampler_logps is not None:
            batch["sampler_logps"] = aligned_sampler_logps(rollouts, rows, batch["labels"].shape[1])
        return batch


def aligned_sampler_logps(rollouts: RolloutBatch, rows: range, width: int) -> torch.Tensor:
    """The sampler's log-probabilities [rows, width], aligned as token log-probabilities are with the
    labels (completion token j of a row is at len(prompt) + j); 0 elsewhere."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for r, i in enumerate(rows):
        start = len(rollouts.prompt_ids[i])
        values = rollouts.sampler_logps[i]
        out[r, start : start + len(values)] = torch.tensor(values, dtype=torch.float32)
    return out


def without_idle_rows(batch: dict) -> dict:
    """The micro-batch without its rows of advantage 0 (at least one row kept), cut to the width of
    the longest row left; the left-out rows' labels and flags kept as `idle_labels`, `idle_truncated`."""
    advantages = batch["advantages"]
    idle = advantages == 0 if advantages.dim() == 1 else (advantages == 0).all(-1)
    keep = torch.nonzero(~idle).flatten()
    if len(keep) == len(batch["advantages"]):
        return batch
    if len(keep) == 0:
        keep = torch.zeros(1, dtype=torch.long)
        idle[0] = False
    width = int(batch["attention_mask"][keep].sum(-1).max())
    out = dict(batch)
    for key in ("input_ids", "attention_mask", "labels"):
        out[key] = batch[key][keep, :width]
    out["advantages"] = advantages[keep] if advantages.dim() == 1 else advantages[keep, :width]
    out["truncated"] = batch["truncated"][keep]
    if "sampler_logps" in batch:
        out["sampler_logps"] = batch["sampler_logps"][keep, :width]
    out["idle_labels"], out["idle_truncated"] = batch["labels"][idle], batch["truncated"][idle]
    return out
