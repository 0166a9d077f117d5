"""Validation of token data: the loss over every held-out set, and the model task's metrics.

Each set is read in its stored order and split among ranks by index (ditty.data.collate.eval_batches),
so every sample counts exactly once whatever the world size. Every batch goes through the trainer's
own forward (the pipeline, its contract check and the fused loss head). The loss is summed over
tokens (or samples) and ranks, then divided: `val_loss`, and `val_loss/NAME` for each named set
([[data.sources]], [data.eval]). Classifiers add `val_accuracy` and `val_f1` (ditty.metrics.classification),
a reward model `val_accuracy` of its pairs (the chosen text scored higher);
a language model's per-token loss gives `val_perplexity`; generation scores exact match: greedy
answers to a built-in dataset's prompts, or greedy decoding of seq2seq targets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch

from ditty._utils.labels import IGNORE_INDEX
from ditty.data.collate import eval_batches
from ditty.train.step import all_reduce_sum


@torch.no_grad()
def evaluate_tokens(
    request: Any, bundle: Any, task: Any, tokenizer: Any, counter: Callable[[dict], torch.Tensor]
) -> dict[str, Any]:
    """The metrics of one evaluation (see the module doc); `counter`: a batch's scored tokens (or
    samples), the weight of a loss that returns a mean. Collective: every rank runs every set."""
    from ditty.metrics.classification import ClassificationCounts

    named = bool(bundle.val_sets)
    sets = list(bundle.val_sets) if named else ([("", bundle.val)] if bundle.val is not None else [])
    collator = bundle.collator.for_validation()
    metrics: dict[str, Any] = {}
    overall = torch.zeros(2, dtype=torch.float64)
    counts = ClassificationCounts(len(bundle.labels)) if bundle.labels is not None else None
    loss_metrics = WeightedMeans() if getattr(request.pipeline.loss, "reports_val_metrics", False) else None
    pairs = pair_accuracy(task)
    for name, dataset in sets:
        if dataset is None or len(dataset) == 0:
            continue
        totals = torch.zeros(2, dtype=torch.float64)  # loss sum, scored tokens (or samples)
        for batch in eval_batches(dataset, request.micro_batch_size, collator):
            out, output = request.forward(batch)
            if out.num_tokens is not None:
                totals += torch.stack(
                    [out.loss.detach().double().cpu(), torch.as_tensor(out.num_tokens).double().cpu()]
                )
                if loss_metrics is not None:  # the loss's own metrics (preference pairs), weighted by its count
                    loss_metrics.add(out.metrics, float(out.num_tokens))
            else:
                scored = torch.as_tensor(counter(batch)).double().cpu()
                if scored > 0:  # a filler batch (see eval_batches): a mean over nothing is NaN
                    totals += torch.stack([out.loss.detach().double().cpu() * scored, scored])
            if counts is not None:
                counts.add(logits_of(output).argmax(-1), batch["labels"])
            if pairs is not None:
                pairs.add(logits_of(output), batch)
        totals = all_reduce_sum(totals)
        overall += totals
        if named and totals[1] > 0:
            metrics[f"val_loss/{name}"] = float(totals[0] / totals[1])
    if overall[1] > 0:
        metrics["val_loss"] = float(overall[0] / overall[1])
        if "perplexity" in task.metrics and loss_metrics is None:  # a preference loss is not per token
            metrics["val_perplexity"] = math.exp(min(metrics["val_loss"], 700.0))
    if loss_metrics is not None:
        metrics.update({f"val_{name}": value for name, value in loss_metrics.result().items()})
    if counts is not None and sets:
        metrics.update({f"val_{name}": value for name, value in counts.result().items()})
    if pairs is not None and sets:
        metrics["val_accuracy"] = pairs.result()
    if "exact_match" in task.metrics and request.eval_samples > 0:
        if bundle.task is not None:  # a built-in dataset's prompts, answered greedily
            with request.autocast():
                scores = bundle.task.evaluate(request.model, tokenizer, request.device, request.eval_samples)
            metrics.update({f"val_{name}": value for name, value in scores.items()})
        elif task.name == "seq2seq" and sets:
            metrics["val_exact_match"] = seq2seq_exact_match(request, sets[0][1], bundle.collator, tokenizer)
    return metrics


class WeightedMeans:
    """Means of a loss's metrics over the evaluated items, summed across ranks."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0.0

    def add(self, metrics: dict, count: float) -> None:
        if count <= 0:
            return
        self.count += count
        for name, value in metrics.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value) * count

    def result(self) -> dict[str, float]:
        names = sorted(self.sums)
        totals = all_reduce_sum(torch.tensor([self.sums[n] for n in names] + [self.count], dtype=torch.float64))
        count = float(totals[-1])
        return {name: float(totals[i]) / count for i, name in enumerate(names)} if count > 0 else {}


def pair_accuracy(task: Any) -> Any:
    """The pair-accuracy counter of a task scored on preference pairs (a reward model), else None."""
    if "accuracy" not in task.metrics or task.data_formats[0] != "preference":
        return None
    from ditty.objectives.reward_stage import PairAccuracy

    return PairAccuracy()


def logits_of(output: Any) -> torch.Tensor:
    # transformers' ModelOutput is a mapping; a custom model may return a tuple with the logits first
    return output["logits"] if isinstance(output, Mapping) else output[0]


@torch.no_grad()
def seq2seq_exact_match(request: Any, dataset: Any, collator: Any, tokenizer: Any) -> float:
    """Greedy decoding of the first `eval_samples` validation targets; the fraction decoded exactly.
    Every rank decodes as many steps (the longest target), since a sharded forward is a collective."""
    from ditty.data.generic import to_device
    from ditty.train.pipeline import model_inputs

    subset = dataset.select(range(min(request.eval_samples, len(dataset))))
    steps = max(len(ids) for ids in subset["labels"])
    totals = torch.zeros(2, dtype=torch.float64)  # exact, counted
    for batch in eval_batches(subset, request.micro_batch_size, collator):
        batch = to_device(batch, request.device)
        decoded = torch.full_like(batch["decoder_input_ids"][:, :1], collator.decoder_start_token_id)
        for _ in range(steps):
            with request.autocast():
                inputs = model_inputs(request.model, {**batch, "decoder_input_ids": decoded})
                logits = logits_of(request.model(**inputs))
            decoded = torch.cat([decoded, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        for generated, labels in zip(decoded[:, 1:].tolist(), batch["labels"].tolist()):
            reference = [token for token in labels if token != IGNORE_INDEX]
            if not reference:  # a filler row (eval_batches)
                continue
            totals[1] += 1
            totals[0] += _text(tokenizer, generated) == _text(tokenizer, reference)
    totals = all_reduce_sum(totals)
    return float(totals[0] / totals[1]) if totals[1] > 0 else 0.0


def _text(tokenizer: Any, ids: list[int]) -> str:
    eos: Optional[int] = tokenizer.eos_token_id
    if eos is not None and eos in ids:
        ids = ids[: ids.index(eos)]
    return tokenizer.decode(ids, skip_special_tokens=True).strip()
