"""`PreferenceLoss`: the DPO family's loss calculator, the last stage of the step's pipeline.

A batch of the "preference" format holds 2N rows, the N chosen completions then the N rejected ones
(ditty.data.formats.preference), which went through ONE forward. The loss takes the output head's
input (the trainer runs the model under `emit_head_input` for a loss with `uses_head_input`) and
scores the completion tokens through the head in chunks (ditty.objectives.logprobs), so no
`[rows, tokens, vocab]` logits are made. The reference's per-sequence log-probabilities come from a
`Reference` (ditty.train.preference): the model with its adapter disabled, a frozen copy, a separate
model, or a table computed before training.

Like every token loss, it returns a SUM (over the pairs of the micro-batch) and its count (the pairs),
and the trainer divides by the pairs of the whole global batch (all micro-batches, all ranks), so any
split gives the same loss and gradients. Its metrics (TRL's names) are this micro-batch's means;
the trainer averages them over the micro-batches and ranks of a step (equal-sized, so the mean of
the global batch), and evaluation weights them by pairs (`reports_val_metrics`).

KTO ("unpaired_preference" rows, N rows with a `label`) takes its KL baseline z from the micro-batch
(each prompt with the previous row's completion, as TRL), so unlike the paired kinds its loss
depends on how the global batch is cut into micro-batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ditty.config.preference import PreferenceConfig
from ditty.objectives import preference as objectives
from ditty.objectives.logprobs import sequence_logps, split_pairs, token_logps
from ditty.objectives.output import ObjectiveOutput
from ditty.objectives.preference import _log1mexp
from ditty.stages.fused_loss import HEAD_INPUT, head_projection, model_config, output_head
from ditty.stages.loss import LossCalculator, LossOutput

ReferenceFn = Callable[[Mapping[str, Tensor]], Tensor]
"""batch -> the reference's per-sequence log-probability sums [rows] (no gradients)."""


class PreferenceLoss(LossCalculator):
    """DPO, IPO, SimPO, ORPO or KTO on preference batches (see the module doc). `reference`: a
    `ReferenceFn`, None for the reference-free kinds; the Python API may pass its own."""

    uses_head_input = True
    reports_val_metrics = True

    def __init__(self, config: Optional[PreferenceConfig] = None, reference: Optional[ReferenceFn] = None, **kw):
        super().__init__(output_index=0, target_key="labels", mask_key=None, name="preference")
        self.config = config if config is not None else PreferenceConfig(**kw)
        self.reference = reference
        if self.config.kind not in objectives_free() and reference is None:
            raise ValueError(f'preference kind "{self.config.kind}" needs a reference')

    def count_tokens(self, batch: Mapping) -> Tensor:
        """The loss's unit: pairs (KTO: examples) with a scored completion."""
        labels = batch["labels"]
        rows = labels if self.config.kind == "kto" else labels.chunk(2, dim=0)[0]
        return (rows[:, 1:] != -100).any(dim=1).sum()

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        batch, model = ctx["batch"], ctx["model"]
        hidden = ctx.get(HEAD_INPUT)
        if hidden is None:
            raise KeyError("PreferenceLoss: no hidden states in the context; the model must run under emit_head_input")
        projection = head_projection(output_head(model), model_config(model))
        logps, scored = token_logps(hidden, projection, batch["labels"], chunks=self.config.chunks)
        policy, lengths = sequence_logps(logps, scored)
        reference = None
        if self.reference is not None:
            with torch.no_grad():
                reference = self.reference(batch).to(policy.device, policy.dtype)
        if self.config.kind == "kto":
            return self._kto(policy, reference, lengths, batch["label"].to(policy.device), hidden)
        return self._paired(policy, reference, lengths, hidden)

    def _paired(self, policy: Tensor, reference: Optional[Tensor], lengths: Tensor, hidden: Tensor) -> LossOutput:
        cfg = self.config
        valid = split_pairs(lengths)[0] > 0  # an evaluation filler pair scores nothing
        pick = lambda values: tuple(half[valid] for half in split_pairs(values))  # noqa: E731
        (pc, pr), (lc, lr) = pick(policy), pick(lengths)
        pairs = int(valid.sum())
        if pairs == 0:
            return LossOutput(loss=policy.sum() * 0.0 + hidden.sum() * 0.0, num_tokens=0)
        rc, rr = pick(reference) if reference is not None else (None, None)
        if cfg.kind == "dpo":
            out = objectives.dpo_loss(
                pc, pr, rc, rr, global_pairs=1, beta=cfg.beta, label_smoothing=cfg.label_smoothing
            )
        elif cfg.kind == "ipo":
            out = objectives.ipo_loss(pc, pr, rc, rr, lc, lr, global_pairs=1, beta=cfg.beta)
        elif cfg.kind == "simpo":
            out = objectives.simpo_loss(
                pc, pr, lc, lr, global_pairs=1, beta=cfg.beta, gamma=cfg.gamma, label_smoothing=cfg.label_smoothing
            )
        elif cfg.kind == "orpo":
            out = orpo_pair_sum(pc, pr, lc, lr, beta=cfg.beta)
        else:
            raise ValueError(f"unknown preference kind {cfg.kind!r}")
        # Sums over the pairs (global_pairs = 1) are the metrics times `pairs`: report the means.
        metrics = {name: float(value) / pairs for name, value in out.metrics.items()}
        loss = out.loss
        if cfg.sft_weight and cfg.kind in ("dpo", "ipo"):
            nll = -(pc / lc.clamp(min=1)).sum()
            loss = loss + cfg.sft_weight * nll
            metrics["nll_loss"] = float(nll.detach()) / pairs
        return LossOutput(loss=loss, metrics=metrics, num_tokens=pairs)

    def _kto(self, policy: Tensor, reference: Tensor, lengths: Tensor, label: Tensor, hidden: Tensor) -> LossOutput:
        cfg = self.config
        valid = lengths > 0
        examples = int(valid.sum())
        if examples == 0:
            return LossOutput(loss=policy.sum() * 0.0 + hidden.sum() * 0.0, num_tokens=0)
        policy, reference, desirable = policy[valid], reference[valid], label[valid].bool()
        # z: the micro-batch's mean log-ratio, a baseline without gradients, clamped at 0 (TRL's estimate
        # from mismatched pairs would need another forward; the mean ratio is its cheaper stand-in).
        kl = objectives.kto_kl(objectives.kto_kl_share(policy, reference, examples))
        out = objectives.kto_loss(
            policy,
            reference,
            desirable,
            kl,
            global_examples=1,
            global_desirable=int(desirable.sum()),  # 0: the kind's metrics are left out, not logged as 0.0
            global_undesirable=int((~desirable).sum()),
            beta=cfg.beta,
            desirable_weight=cfg.desirable_weight,
            undesirable_weight=cfg.undesirable_weight,
        )
        metrics = {name: float(value) for name, value in out.metrics.items() if name != "kl"}
        metrics["kl"] = float(kl)
        return LossOutput(loss=out.loss, metrics=metrics, num_tokens=examples)


def orpo_pair_sum(pc: Tensor, pr: Tensor, lc: Tensor, lr: Tensor, *, beta: float) -> ObjectiveOutput:
    """ORPO summed over the pairs: per pair, the chosen completion's mean-token NLL (the paper's
    length-normalised SFT term) minus beta times logsig(log odds ratio). A per-pair term, so the loss
    is a mean over pairs like every other kind (TRL averages its NLL over the batch's tokens)."""
    chosen, rejected = pc / lc.clamp(min=1), pr / lr.clamp(min=1)
    log_odds = (chosen - rejected) - (_log1mexp(chosen) - _log1mexp(rejected))
    ratio = torch.nn.functional.logsigmoid(log_odds).sum()
    nll = -chosen.sum()
    metrics = objectives.pair_metrics(beta * chosen, beta * rejected, chosen, rejected, 1)
    metrics.update(nll_loss=nll.detach(), log_odds_ratio=ratio.detach(), log_odds_chosen=log_odds.sum().detach())
    return ObjectiveOutput(nll - beta * ratio, metrics)


def objectives_free() -> tuple[str, ...]:
    from ditty.config.preference import REFERENCE_FREE

    return REFERENCE_FREE
