"""The loss stage of `model.task = "reward-model"`: Bradley-Terry (ditty.objectives.reward_model) on the
scores of preference pairs, as a `LossCalculator` the trainer's pipeline calls; and the pair accuracy
that validation reports (`val_accuracy`).

A batch of the "preference" format holds 2N rows, the N chosen texts (prompt + chosen completion)
and then the N rejected ones, right-padded together, so both sides of every pair go through ONE
forward. A sequence classifier with one output (`AutoModelForSequenceClassification`, num_labels 1)
reads its score at each row's last token that is not padding (its config's pad_token_id); a model
that returns a score per token ([2N, T] or [2N, T, 1]) is read at the last attended position the
same way, so what is trained is what `from_pretrained(final)` computes.

The loss is -log sigmoid(r_chosen - r_rejected) summed over this micro-batch's pairs, returned with
the pair count (`LossOutput.num_tokens`): the trainer divides by the pairs of the whole global batch
(the preference collator's `supervised_count` counts pairs), so any split over micro-batches and
ranks gives the same loss and gradients. An evaluation filler pair (nothing scored, see
ditty.data.collate.eval_batches) adds nothing. Metrics use TRL's names: rewards/chosen,
rewards/rejected, rewards/margins, rewards/accuracies (micro-batch means).

It lives with the objectives rather than in ditty.stages: stages sit below the objectives in the
layer table (the objectives reuse the fused loss's head), so only this side may import both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

from ditty._utils.labels import IGNORE_INDEX
from ditty.data.context_shard import SCORED_ROWS
from ditty.metrics.task_metrics import TaskMetric, logits_of
from ditty.stages.loss import LossCalculator, LossOutput

if TYPE_CHECKING:
    from torch import Tensor


class BradleyTerryLoss(LossCalculator):
    reports_val_metrics = True
    """Validation also averages this loss's metrics over the held-out pairs (val_rewards/...), where the
    trainer's evaluation reads that flag."""

    def __init__(
        self,
        output_index: Union[int, str] = "logits",
        *,
        center_rewards_coefficient: Optional[float] = None,
        contract: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        """`center_rewards_coefficient` (TRL's, default off) adds c * mean((r_chosen + r_rejected)^2),
        which keeps the rewards centred on zero (Eisenstein et al. 2023)."""
        super().__init__(output_index, target_key="labels", mask_key=None, contract=contract, **kwargs)
        self.center_rewards_coefficient = center_rewards_coefficient

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        from ditty.objectives.context_rows import piece_share
        from ditty.objectives.reward_model import bradley_terry_loss

        batch = ctx.get("batch") or ctx.get("original_batch") or {}
        chosen, rejected, real = pair_scores(self.get_prediction(model_output), batch)
        chosen, rejected = chosen[real], rejected[real]  # a filler pair of evaluation counts nothing
        pairs = chosen.shape[0]
        # global_pairs = 1: the SUM over this micro-batch's pairs; the trainer divides by the global count.
        out = bradley_terry_loss(
            chosen, rejected, global_pairs=1, center_rewards_coefficient=self.center_rewards_coefficient
        )
        # Under context parallel every rank of the group scores the whole rows: each returns its share.
        part = piece_share()
        count = max(pairs, 1)
        metrics = {
            "rewards/chosen": out.metrics["rewards/chosen"] / count,
            "rewards/rejected": out.metrics["rewards/rejected"] / count,
            "rewards/margins": out.metrics["margin"] / count,
            "rewards/accuracies": out.metrics["accuracy"] / count,
        }
        return LossOutput(loss=out.loss * part, metrics=metrics if pairs else {}, num_tokens=pairs)


class PairAccuracyMetric(TaskMetric):
    """The reward-model row's validation metric (ditty.models.tasks): `val_accuracy` of the pairs."""

    def __init__(self) -> None:
        self.pairs = PairAccuracy()

    def update(self, output: Any, batch: Any) -> None:
        self.pairs.add(logits_of(output), batch)

    def compute(self, ev: Any) -> dict[str, float]:
        return {"val_accuracy": self.pairs.result()} if ev.sets else {}


def pair_scores(prediction: "Tensor", batch: Mapping) -> "tuple[Tensor, Tensor, Tensor]":
    """(chosen scores [N], rejected scores [N], real pairs [N] bool) of a 2N-row preference batch, in
    fp32. `prediction`: one score per row ([2N] or [2N, 1]), or per token ([2N, T] or [2N, T, 1]),
    read at each row's last attended token."""
    import torch

    from ditty.objectives.logprobs import split_pairs

    scores = prediction.float()
    if scores.dim() == 3:
        scores = scores.squeeze(-1)
    if scores.dim() == 2 and scores.shape[1] != 1:  # one score per token
        mask = batch.get("attention_mask")
        if mask is None:
            mask = torch.ones(scores.shape, dtype=torch.long, device=scores.device)
        positions = torch.arange(scores.shape[1], device=scores.device)
        last = (positions * mask.to(scores.device).bool()).argmax(-1)
        scores = scores.gather(1, last[:, None])
    if scores.dim() != 2 or scores.shape[1] != 1:
        raise ValueError(
            f"a reward model gives one score per text: got {tuple(prediction.shape)}; build it with num_labels = 1"
        )
    chosen, rejected = split_pairs(scores.squeeze(1))
    labels = batch.get("labels")
    if SCORED_ROWS in batch:  # a context-parallel piece: the whole rows' flags
        real = split_pairs(batch[SCORED_ROWS])[0].to(chosen.device)
    elif labels is None:
        real = torch.ones(chosen.shape, dtype=torch.bool, device=chosen.device)
    else:
        real = (split_pairs(labels)[0][:, 1:] != IGNORE_INDEX).any(dim=1).to(chosen.device)
    return chosen, rejected, real


class PairAccuracy:
    """The fraction of held-out pairs whose chosen text scores above the rejected one, summed over
    batches and ranks (one all-reduce in `result`)."""

    def __init__(self) -> None:
        import torch

        self.totals = torch.zeros(2, dtype=torch.float64)  # pairs ranked right, real pairs

    def add(self, prediction: "Tensor", batch: Mapping) -> None:
        chosen, rejected, real = pair_scores(prediction, batch)
        self.totals[0] += float(((chosen > rejected) & real).sum())
        self.totals[1] += float(real.sum())

    def result(self) -> float:
        import torch
        import torch.distributed as dist

        totals = self.totals.clone()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
            totals = totals.to(device)
            dist.all_reduce(totals)
            totals = totals.cpu()
        return float(totals[0] / totals[1]) if totals[1] > 0 else 0.0
