"""The validation metrics of the model tasks (ditty.models.tasks lists them in each task's row).

A metric is a class, built once per evaluation: `update(output, batch)` sees every validation
batch of this rank (the model's output after the postprocessors), `compute(ev)` returns its
`val_*` values. Both run on every rank (a sharded forward and the sums over ranks are collectives).

`ev` is the evaluation (ditty.train.evaluate.Evaluation): `val_loss` (None without validation
data), `sets` (the held-out sets, [(name, dataset)]), `bundle` (the data: its `task` of prompts and
answers, its `collator`), `tokenizer`, `model` (unwrapped), `device`, `eval_samples`, `autocast()`,
and the helpers `batches(dataset, collator)` (this rank's share, on the device), `model_inputs(batch)`
and `all_reduce_sum(tensor)`.

Cheap to import (no torch at module level): the task table, which the compiler reads, names these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class TaskMetric:
    def update(self, output: Any, batch: Any) -> None:
        """One validation batch of this rank."""

    def compute(self, ev: Any) -> dict[str, float]:
        raise NotImplementedError


def logits_of(output: Any) -> Any:
    # transformers' ModelOutput is a mapping; a custom model may return a tuple with the logits first
    return output["logits"] if isinstance(output, Mapping) else output[0]


class Perplexity(TaskMetric):
    """val_perplexity: exp of the per-token validation loss."""

    def compute(self, ev: Any) -> dict[str, float]:
        return {} if ev.val_loss is None else {"val_perplexity": math.exp(min(ev.val_loss, 700.0))}


class Classification(TaskMetric):
    """val_accuracy and val_f1 (macro) of the argmax class (ditty.metrics.classification)."""

    def __init__(self) -> None:
        self.counts: Any = None

    def update(self, output: Any, batch: Any) -> None:
        from ditty.metrics.classification import ClassificationCounts

        logits = logits_of(output)
        if self.counts is None:  # the head's width is the label count
            self.counts = ClassificationCounts(logits.shape[-1])
        self.counts.add(logits.argmax(-1), batch["labels"])

    def compute(self, ev: Any) -> dict[str, float]:
        # Every rank saw as many batches (ditty.data.collate.eval_batches), so all or none have counts.
        return {} if self.counts is None else {f"val_{k}": v for k, v in self.counts.result().items()}


class GeneratedExactMatch(TaskMetric):
    """val_exact_match (and the task's other scores): greedy answers to the held-out prompts of a
    built-in dataset or `data.val_exact_match` (ditty.data.task.Task)."""

    def compute(self, ev: Any) -> dict[str, float]:
        task = ev.bundle.task
        if task is None or ev.eval_samples <= 0:
            return {}
        with ev.autocast():
            scores = task.evaluate(ev.model, ev.tokenizer, ev.device, ev.eval_samples)
        return {f"val_{name}": value for name, value in scores.items()}


class Seq2SeqExactMatch(TaskMetric):
    """val_exact_match: greedy decoding of the first `eval_samples` validation targets, the fraction
    decoded exactly. Every rank decodes as many steps (the longest target), since a sharded forward
    is a collective."""

    def compute(self, ev: Any) -> dict[str, float]:
        import torch

        from ditty._utils.labels import IGNORE_INDEX

        if ev.eval_samples <= 0 or not ev.sets:
            return {}
        dataset, collator = ev.sets[0][1], ev.bundle.collator
        subset = dataset.select(range(min(ev.eval_samples, len(dataset))))
        steps = max(len(ids) for ids in subset["labels"])
        totals = torch.zeros(2, dtype=torch.float64)  # exact, counted
        for batch in ev.batches(subset, collator):
            decoded = torch.full_like(batch["decoder_input_ids"][:, :1], collator.decoder_start_token_id)
            for _ in range(steps):
                with ev.autocast():
                    logits = logits_of(ev.model(**ev.model_inputs({**batch, "decoder_input_ids": decoded})))
                decoded = torch.cat([decoded, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            for generated, labels in zip(decoded[:, 1:].tolist(), batch["labels"].tolist()):
                reference = [token for token in labels if token != IGNORE_INDEX]
                if reference:  # not a filler row (eval_batches)
                    totals[1] += 1
                    totals[0] += _text(ev.tokenizer, generated) == _text(ev.tokenizer, reference)
        totals = ev.all_reduce_sum(totals)
        return {"val_exact_match": float(totals[0] / totals[1]) if totals[1] > 0 else 0.0}


def _text(tokenizer: Any, ids: list[int]) -> str:
    eos = tokenizer.eos_token_id
    if eos is not None and eos in ids:
        ids = ids[: ids.index(eos)]
    return tokenizer.decode(ids, skip_special_tokens=True).strip()
