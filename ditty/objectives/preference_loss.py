"""`PreferenceLoss`: the DPO family's loss stage (DPO, IPO, SimPO, ORPO, KTO), the last stage of the step's pipeline.

A batch of the "preference" format holds 2N rows, the N chosen completions then the N rejected ones
(ditty.data.formats.preference_rows), which went through ONE forward. The loss takes the output head's
input (the trainer runs the model under `emit_head_input` for a loss with `uses_head_input`) and
scores the completion tokens through the head in chunks (ditty.objectives.logprobs), so no
`[rows, tokens, vocab]` logits are made. The reference's per-sequence log-probabilities come from a
reference (ditty.objectives.reference): the model with its adapter disabled, a frozen copy, a
separate model, or a table computed before training; or from a function of one's own.

It runs the tested functions of ditty.objectives.dpo_family with the counts of the whole global
batch: `count_units` declares them (pairs; KTO: examples, and the desirable and undesirable ones),
the trainer sums them over every micro-batch and rank before the first forward and hands them over
as `ctx["global_units"]`, and the loss and its metrics (TRL's names) are this micro-batch's shares,
which the trainer adds up. So any split of a global batch gives the same loss, gradients and
metrics, but KTO's: its KL baseline z is the mean log-ratio of the micro-batch's own examples
(TRL estimates it per device batch, from mismatched pairs that cost another forward).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ditty.config.preference import REFERENCE_FREE, PreferenceConfig
from ditty.data.formats.preference_rows import counted_rows
from ditty.objectives import dpo_family as objectives
from ditty.objectives.context_rows import piece_share, whole_row_sums
from ditty.objectives.logprobs import batch_token_logps, sequence_logps, split_pairs
from ditty.objectives.output import share
from ditty.stages.fused_loss import HEAD_INPUT, head_projection, model_config, output_head, replicated
from ditty.stages.loss import LossCalculator, LossOutput

ReferenceFn = Callable[[Mapping[str, Tensor]], Tensor]
"""batch -> the reference's per-sequence log-probability sums [rows] (no gradients)."""


class PreferenceLoss(LossCalculator):
    """DPO, IPO, SimPO, ORPO or KTO on preference batches (see the module doc). `reference`: a
    `ReferenceFn` (a ditty.objectives.reference.Reference is one), None for the reference-free kinds;
    the Python API may pass its own."""

    uses_head_input = True
    reports_val_metrics = True

    def __init__(self, config: Optional[PreferenceConfig] = None, reference: Optional[ReferenceFn] = None, **kw):
        super().__init__(output_index=0, target_key="labels", mask_key=None, name="preference")
        self.config = config if config is not None else PreferenceConfig(**kw)
        self.reference = reference
        if self.config.kind not in REFERENCE_FREE and reference is None:
            raise ValueError(f'preference kind "{self.config.kind}" needs a reference')

    def count_units(self, batch: Mapping) -> dict[str, Tensor]:
        """The global counts the loss is a mean over (the first is its denominator): pairs with a
        scored completion; for KTO the examples, and how many of them are desirable or not."""
        scored = counted_rows(batch)  # under context parallel: on the first piece of each row only
        if self.config.kind != "kto":
            return {"pairs": scored.chunk(2, dim=0)[0].sum()}
        valid, desirable = scored, batch["label"].bool()
        return {
            "examples": valid.sum(),
            "desirable": (valid & desirable).sum(),
            "undesirable": (valid & ~desirable).sum(),
        }

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        batch, model = ctx["batch"], ctx["model"]
        hidden = ctx.get(HEAD_INPUT)
        if hidden is None:
            raise KeyError("PreferenceLoss: no hidden states in the context; the model must run under emit_head_input")
        projection = head_projection(output_head(model), model_config(model), keep_vocab_shards=True)
        logps, scored = batch_token_logps(hidden, projection, batch, chunks=self.config.chunks)
        # Under context parallel each rank holds pieces of the rows: the rows' sums are the group's.
        policy, lengths = (whole_row_sums(values) for values in sequence_logps(logps, scored))
        reference = None
        if self.reference is not None:
            with torch.no_grad():
                reference = self.reference(batch).to(policy.device, policy.dtype)
        units = ctx["global_units"]
        if self.config.kind == "kto":
            return self._kto(policy, reference, lengths, batch["label"].to(policy.device), hidden, units)
        return self._paired(policy, reference, lengths, hidden, units["pairs"])

    def _paired(
        self, policy: Tensor, reference: Optional[Tensor], lengths: Tensor, hidden: Tensor, pairs
    ) -> LossOutput:
        cfg = self.config
        valid = split_pairs(lengths)[0] > 0  # an evaluation filler pair scores nothing
        pick = lambda values: tuple(half[valid] for half in split_pairs(values))  # noqa: E731
        (pc, pr), (lc, lr) = pick(policy), pick(lengths)
        if not bool(valid.any()):
            return LossOutput(loss=policy.sum() * 0.0 + replicated(hidden).sum() * 0.0, share=True)
        rc, rr = pick(reference) if reference is not None else (None, None)
        if cfg.kind == "dpo":
            out = objectives.dpo_loss(
                pc, pr, rc, rr, global_pairs=pairs, beta=cfg.beta, label_smoothing=cfg.label_smoothing
            )
        elif cfg.kind == "ipo":
            out = objectives.ipo_loss(pc, pr, rc, rr, lc, lr, global_pairs=pairs, beta=cfg.beta)
        elif cfg.kind == "simpo":
            out = objectives.simpo_loss(
                pc, pr, lc, lr, global_pairs=pairs, beta=cfg.beta, gamma=cfg.gamma, label_smoothing=cfg.label_smoothing
            )
        elif cfg.kind == "orpo":
            out = objectives.orpo_loss(pc, pr, lc, lr, global_pairs=pairs, beta=cfg.beta)
        else:
            raise ValueError(f"unknown preference kind {cfg.kind!r}")
        loss, metrics = out.loss, dict(out.metrics)
        if cfg.sft_weight and cfg.kind in ("dpo", "ipo"):  # the chosen completion's mean-token NLL, per pair
            nll = share(-(pc / lc.clamp(min=1)), pairs)
            loss = loss + cfg.sft_weight * nll
            metrics["nll_loss"] = nll.detach()
        # A context-parallel rank returns its share of the loss its group computes alike (context_rows).
        part = piece_share()
        return LossOutput(
            loss=loss * part if part != 1.0 else loss,
            metrics={name: float(value) * part for name, value in metrics.items()},
            share=True,
        )

    def _kto(
        self, policy: Tensor, reference: Tensor, lengths: Tensor, label: Tensor, hidden: Tensor, units: dict
    ) -> LossOutput:
        cfg = self.config
        valid = lengths > 0
        examples = int(valid.sum())
        if examples == 0:
            return LossOutput(loss=policy.sum() * 0.0 + replicated(hidden).sum() * 0.0, share=True)
        policy, reference, desirable = policy[valid], reference[valid], label[valid].bool()
        kl = objectives.kto_kl(objectives.kto_kl_share(policy, reference, examples))
        out = objectives.kto_loss(
            policy,
            reference,
            desirable,
            kl,
            global_examples=units["examples"],
            global_desirable=units["desirable"],
            global_undesirable=units["undesirable"],
            beta=cfg.beta,
            desirable_weight=cfg.desirable_weight,
            undesirable_weight=cfg.undesirable_weight,
        )
        part = piece_share()  # as in _paired
        return LossOutput(
            loss=out.loss * part if part != 1.0 else out.loss,
            metrics={name: float(value) * part for name, value in out.metrics.items()},
            share=True,
        )
