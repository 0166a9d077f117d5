"""`TaskDataMode`: the data mode of the model tasks other than causal LM (ditty/models/tasks.py).

| task                 | a batch                                        | val metrics beside val_loss |
|----------------------|------------------------------------------------|-----------------------------|
| seq-classification   | tokenizer inputs, labels [B]                   | val_accuracy, val_f1        |
| token-classification | tokenizer inputs, labels [B, T] (first pieces) | val_accuracy, val_f1        |
| seq2seq              | source inputs, decoder_input_ids, labels       | val_exact_match (greedy)    |
| masked-lm            | masked inputs, labels at the masked tokens     | val_perplexity              |

The loss's denominator is the scored labels of the batch (the loss's `count_tokens`); `tokens`
counts the non-padding tokens that entered the model (encoder and decoder). Evaluation reads the
whole validation set on every rank's share and sums the counts over ranks, so the metrics do not
depend on the world size; seq2seq exact match decodes the first `train.eval_samples` validation
samples greedily, the same number of steps on every rank (a sharded forward is a collective).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from ditty.train.data_modes import DataMode, EvalRequest


class TaskDataMode(DataMode):
    token_batches = True  # token rows for call_model: the model takes its inputs by name

    @property
    def labels(self) -> Any:
        return self.bundle.labels

    def stream(self, accumulation_steps: int) -> Any:
        from ditty.data.task_collate import TaskStream

        t = self.config.train
        return TaskStream(
            self.bundle.train,
            self.bundle.collator,
            global_batch_size=t.global_batch_size,
            micro_batch_size=t.micro_batch_size,
            rank=self.runtime.rank,
            world_size=self.runtime.world_size,
            seed=self.bundle.seed,
            group_lengths=self.config.data.group_by_length,
        )

    def supervised_count(self, batch: Any, loss: Any) -> torch.Tensor:
        from ditty._utils.labels import IGNORE_INDEX

        counter = getattr(loss, "count_tokens", None)
        return counter(batch) if counter is not None else (batch["labels"] != IGNORE_INDEX).sum()

    def input_count(self, batch: Any) -> torch.Tensor:
        from ditty._utils.labels import IGNORE_INDEX

        tokens = batch["attention_mask"].sum()
        if "decoder_input_ids" in batch:  # the decoder reads one input per target token
            tokens = tokens + (batch["labels"] != IGNORE_INDEX).sum()
        return tokens

    def evaluate(self, request: EvalRequest) -> dict[str, Any]:
        from ditty.data.task_collate import task_eval_batches
        from ditty.metrics.classification import ClassificationCounts
        from ditty.models.tasks import model_task
        from ditty.train.step import all_reduce_sum

        task = model_task(self.config.model.task)
        metrics: dict[str, Any] = {}
        val = self.val
        if val is None or len(val) == 0:
            return metrics
        counts = ClassificationCounts(len(self.labels)) if self.labels is not None else None
        totals = torch.zeros(2, dtype=torch.float64)  # loss sum, scored labels
        collator = self.bundle.collator.for_validation()
        for batch in task_eval_batches(val, request.micro_batch_size, collator):
            out, output = self._forward(request, batch)
            scored = torch.as_tensor(out.num_tokens if out.num_tokens is not None else self._scored(batch))
            loss_sum = out.loss if out.num_tokens is not None else out.loss * scored
            if float(scored) > 0:
                totals += torch.stack([loss_sum.detach().double().cpu(), scored.double().cpu()])
            if counts is not None:
                counts.add(_logits(output).argmax(-1), batch["labels"])
        totals = all_reduce_sum(totals)
        if totals[1] > 0:
            metrics["val_loss"] = float(totals[0] / totals[1])
            if "perplexity" in task.metrics:
                metrics["val_perplexity"] = math.exp(min(metrics["val_loss"], 700.0))
        if counts is not None:
            metrics.update({f"val_{name}": value for name, value in counts.result().items()})
        if "exact_match" in task.metrics and request.eval_samples > 0:
            metrics["val_exact_match"] = self._exact_match(request)
        return metrics

    def _scored(self, batch: dict) -> torch.Tensor:
        from ditty._utils.labels import IGNORE_INDEX

        return (batch["labels"] != IGNORE_INDEX).sum()

    def _forward(self, request: EvalRequest, batch: dict) -> tuple[Any, Any]:
        """The pipeline on one batch, in evaluation mode: (the loss calculator's output, the model's
        output after the postprocessors; its logits give the predictions)."""
        from ditty.data.generic import to_device
        from ditty.stages.processors import Context
        from ditty.train.pipeline import call_model

        ctx = Context(
            step=request.step, micro_step=0, num_micro_steps=1, training=False, model=request.model,
            tokenizer=self.tokenizer, device=request.device,
        )  # fmt: skip
        batch = to_device(batch, request.device)
        ctx["original_batch"] = batch
        for processor in request.pipeline.preprocessors:
            batch, ctx = processor.process(batch, ctx)
        ctx["batch"] = batch
        with request.autocast():
            output = call_model(request.model, batch, ctx.get("forward_kwargs", {}), lm=True)
        for processor in request.pipeline.postprocessors:
            output, ctx = processor.process(output, ctx)
        return request.pipeline.loss(output, ctx), output

    @torch.no_grad()
    def _exact_match(self, request: EvalRequest) -> float:
        """Greedy decoding of the first `eval_samples` validation targets; the fraction decoded exactly."""
        from ditty._utils.labels import IGNORE_INDEX
        from ditty.data.generic import to_device
        from ditty.data.task_collate import task_eval_batches
        from ditty.train.pipeline import model_inputs
        from ditty.train.step import all_reduce_sum

        subset = self.val.select(range(min(request.eval_samples, len(self.val))))
        collator, tokenizer = self.bundle.collator, self.tokenizer
        totals = torch.zeros(2, dtype=torch.float64)  # exact, counted
        for batch in task_eval_batches(subset, request.micro_batch_size, collator):
            batch = to_device(batch, request.device)
            decoded = torch.full_like(batch["decoder_input_ids"][:, :1], collator.decoder_start_token_id)
            for _ in range(self.bundle.max_new_tokens):
                with request.autocast():
                    inputs = model_inputs(request.model, {**batch, "decoder_input_ids": decoded})
                    logits = _logits(request.model(**inputs))
                decoded = torch.cat([decoded, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            for generated, labels in zip(decoded[:, 1:].tolist(), batch["labels"].tolist()):
                reference = [token for token in labels if token != IGNORE_INDEX]
                if not reference:  # a filler row (task_eval_batches)
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


def _logits(output: Any) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output[0]


def uses_task_mode(config: Any, components: Any) -> bool:
    """The task's data is rows of a task format: from `[data]`, or the Python API's rows."""
    from ditty.models.tasks import model_task

    if model_task(config.model.task).token_rows:
        return False
    return takes_task_rows(config, components) if components.has_data else True


def takes_task_rows(config: Any, components: Any) -> bool:
    """The Python API's dataset holds rows of the task's format (ditty checks and tokenizes them), not
    samples for a collate function: a non-causal task, a dataset, and neither a loader nor a collate_fn."""
    from ditty.models.tasks import model_task

    return (
        not model_task(config.model.task).token_rows
        and components.dataset is not None
        and components.dataloader is None
        and components.collate_fn is None
    )


def build_task_data_mode(config: Any, runtime: Any, tokenizer: Any, components: Any) -> TaskDataMode:
    """Rows of `data.format` (from [data], or the Python API's rows) checked, labelled and tokenized.
    What the model already says (a pretrained classifier's label names, a seq2seq model's decoder start
    token) is read from its config first, so the data's label ids and decoder inputs fit it."""
    from ditty.data.task_data import build_task_data

    if tokenizer is None:
        from ditty.config.errors import RecipeError

        raise RecipeError.single(
            f'model.task = "{config.model.task}" reads text, and there is no tokenizer',
            key="tokenizer.path",
            fix="set tokenizer.path (or model.path), or pass tokenizer= to the Pipeline",
        )
    label_hint, start = _model_facts(config, components.model, tokenizer)
    bundle = build_task_data(
        config.data,
        tokenizer,
        config.run.seed,
        label_hint=label_hint,
        decoder_start_token_id=start,
        rows=components.dataset if components.has_data else None,
        val_rows=components.val_dataset if components.has_data else None,
    )
    if components.model is not None and bundle.labels is not None:
        fit_instance_labels(components.model, bundle.labels)
    return TaskDataMode(bundle, config, runtime, tokenizer)


def _model_facts(config: Any, given: Any, tokenizer: Any) -> tuple[Optional[list[str]], Optional[int]]:
    """(label names of the model's config in id order, its decoder start token id)."""
    model_config = getattr(given, "config", None) if given is not None else None
    if given is None and not config.model.factory:
        from ditty.models.build import hf_config

        _, model_config = hf_config(config.model, {})
    if model_config is None:
        return None, None
    id2label = getattr(model_config, "id2label", None) or {}
    names = [str(id2label[key]) for key in sorted(id2label, key=int)] or None
    start = getattr(model_config, "decoder_start_token_id", None)
    if start is None and getattr(model_config, "is_encoder_decoder", False):
        start = tokenizer.pad_token_id  # what ditty.models.build gives a config without one (T5's rule)
    return names, start


def fit_instance_labels(model: Any, labels: Any) -> None:
    """A given classifier must have a head of the data's label count; its label names become the data's."""
    from ditty.config.errors import RecipeError

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_labels"):
        return
    if config.num_labels != len(labels):
        raise RecipeError.single(
            f"the given model classifies into {config.num_labels} labels and the data has {len(labels)} "
            f"({', '.join(labels.names[:8])})",
            key="model_factory",
            fix=f"build the model with num_labels={len(labels)} (and id2label/label2id), or fix the data's labels",
        )
    # The label ids already follow the model's own names when they cover the data (LabelSpace's hint);
    # otherwise (transformers' LABEL_i defaults, say) the model takes the data's names.
    current = [str(config.id2label[i]) for i in sorted(config.id2label)]
    if current != list(labels.names):
        config.id2label = dict(enumerate(labels.names))
        config.label2id = {name: index for index, name in enumerate(labels.names)}
