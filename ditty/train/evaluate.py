"""Validation of token data: the loss over every held-out set, and the model task's metrics.

Each set is read in its stored order and split among ranks by index (ditty.data.collate.eval_batches),
so every sample counts exactly once whatever the world size. Every batch goes through the trainer's
own forward (the pipeline, its contract check and the fused loss head). The loss is summed over
tokens (or samples) and ranks, then divided: `val_loss`, and `val_loss/NAME` for each named set
([[data.sources]], [data.eval]). The model task's metrics (ditty.metrics.task_metrics, listed in its
row of ditty.models.tasks) see every batch and add their val_* values; the data's evaluation hook
(the digits' sample grid, the Python API's task=) adds its scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ditty.data.collate import eval_batches
from ditty.metrics.task_metrics import Perplexity
from ditty.train.step import all_reduce_sum


@dataclass
class Evaluation:
    """What a task metric reads (see ditty.metrics.task_metrics)."""

    bundle: Any
    tokenizer: Any
    sets: list
    val_loss: Optional[float]
    model: torch.nn.Module
    device: torch.device
    eval_samples: int
    autocast: Callable
    micro_batch_size: int

    def batches(self, dataset: Any, collator: Any):
        from ditty.data.generic import to_device

        for batch in eval_batches(dataset, self.micro_batch_size, collator):
            yield to_device(batch, self.device)

    def model_inputs(self, batch: dict) -> dict:
        from ditty.models.inputs import model_inputs

        return model_inputs(self.model, batch)

    all_reduce_sum = staticmethod(all_reduce_sum)


@torch.no_grad()
def evaluate_tokens(
    request: Any, bundle: Any, task: Any, tokenizer: Any, counter: Callable[[dict], torch.Tensor]
) -> dict[str, Any]:
    """The metrics of one evaluation (see the module doc); `counter`: a batch's scored tokens (or
    samples), the weight of a loss that returns a mean. Collective: every rank runs every set."""
    named = bool(bundle.val_sets)
    sets = list(bundle.val_sets) if named else ([("", bundle.val)] if bundle.val is not None else [])
    sets = [(name, dataset) for name, dataset in sets if dataset is not None and len(dataset) > 0]
    collator = bundle.collator.for_validation()
    # The task's metrics read token outputs; built-in images (a custom model) have only their hook.
    task_metrics = [make() for make in task.metrics] if bundle.collator.tokenized else []
    # A loss that reports its own metrics (a preference loss: rewards/*, logps/*) gets them averaged over
    # the held-out items as val_*; its loss is a mean over pairs, not tokens, so no perplexity.
    loss_metrics = LossMetricMeans() if getattr(request.pipeline.loss, "reports_val_metrics", False) else None
    if loss_metrics is not None:
        task_metrics = [metric for metric in task_metrics if not isinstance(metric, Perplexity)]
    metrics: dict[str, Any] = {}
    overall = torch.zeros(2, dtype=torch.float64)
    for name, dataset in sets:
        totals = torch.zeros(2, dtype=torch.float64)  # loss sum, scored tokens (or samples)
        for batch in eval_batches(dataset, request.micro_batch_size, collator):
            out, output = request.forward(batch)
            if out.num_tokens is not None:
                totals += torch.stack(
                    [out.loss.detach().double().cpu(), torch.as_tensor(out.num_tokens).double().cpu()]
                )
                if loss_metrics is not None:
                    loss_metrics.add(out.metrics, float(out.num_tokens))
            else:
                scored = torch.as_tensor(counter(batch)).double().cpu()
                if scored > 0:  # a filler batch (see eval_batches): a mean over nothing is NaN
                    totals += torch.stack([out.loss.detach().double().cpu() * scored, scored])
            for metric in task_metrics:
                metric.update(output, batch)
        totals = all_reduce_sum(totals)
        overall += totals
        if named and totals[1] > 0:
            metrics[f"val_loss/{name}"] = float(totals[0] / totals[1])
    if overall[1] > 0:
        metrics["val_loss"] = float(overall[0] / overall[1])
    r = request
    evaluation = Evaluation(
        bundle, tokenizer, sets, metrics.get("val_loss"), r.model, r.device, r.eval_samples, r.autocast,
        r.micro_batch_size,
    )  # fmt: skip
    for metric in task_metrics:
        metrics.update(metric.compute(evaluation))
    if loss_metrics is not None:
        metrics.update({f"val_{name}": value for name, value in loss_metrics.result().items()})
    held_out = getattr(request.pipeline.loss, "held_out", None)  # what a loss tallied itself (the MTP heads')
    if held_out is not None:
        metrics.update(held_out.result(all_reduce_sum))
    return metrics | hook_scores(bundle.hook, request)


class LossMetricMeans:
    """Means of a loss's metrics over the evaluated items (its `num_tokens`), summed across ranks."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0.0

    def add(self, metrics: dict, count: float) -> None:
        if count <= 0:
            return
        self.count += count
        for name, value in (metrics or {}).items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value) * count

    def result(self) -> dict[str, float]:
        names = sorted(self.sums)
        totals = all_reduce_sum(torch.tensor([self.sums[n] for n in names] + [self.count], dtype=torch.float64))
        count = float(totals[-1])
        return {name: float(totals[i]) / count for i, name in enumerate(names)} if count > 0 else {}


@torch.no_grad()
def evaluate_samples(request: Any, bundle: Any) -> dict[str, Any]:
    """The Python API's samples: `val_loss` as the sample-weighted mean over the whole validation set
    (or validation DataLoader), and the scores of its evaluation hook (a diffusion sample grid, say)."""
    from ditty.data.generic import batch_samples, eval_micro_batches

    metrics: dict[str, Any] = {}
    val = bundle.val
    if val is not None and len(val) > 0:
        total, count = 0.0, 0
        for batch in eval_micro_batches(val, request.micro_batch_size, bundle.collator):
            out, _ = request.forward(batch)
            size = batch_samples(batch)
            total += float(out.mean_loss()) * size
            count += size
        metrics["val_loss"] = total / max(count, 1)
    return metrics | hook_scores(bundle.hook, request)


def hook_scores(hook: Any, request: Any) -> dict[str, Any]:
    """The scores of the data's evaluation hook (ditty.data.generic.GenericTask) as val_<name>. Every
    rank runs it (a sharded model's forward needs them all); only rank 0 has a run_dir to write into."""
    if hook is None or request.eval_samples <= 0:
        return {}
    with request.autocast():
        scores = hook.evaluate(
            request.model, device=request.device, pipeline=request.pipeline, run_dir=request.run_dir, step=request.step
        )
    return {k if k.startswith("val_") else f"val_{k}": v for k, v in scores.items()}
