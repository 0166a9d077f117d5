"""Data modes: what the trainer does with one kind of data. One class per mode:

| mode             | data                                              | a batch                | `tokens` metric    |
|------------------|---------------------------------------------------|------------------------|--------------------|
| `TokenDataMode`  | tokenized rows from `[data]` (ditty.data)         | input_ids, labels      | non-padding tokens |
| `SampleDataMode` | samples + a collate function: a Python API        | what `collate_fn` made | samples            |
|                  | dataset or DataLoader, the built-in digits images |                        |                    |

Each knows how to cut the global order into this rank's micro-batches (its stream), how to count a
batch (the loss's denominator and the `tokens` metric), and how to evaluate. The trainer asks the
mode and never which mode it is. A new mode (streamed or mixed data, say) is one class here and a
branch in `build_data_mode`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ditty.config.errors import RecipeError
from ditty.data.generic import batch_samples


@dataclass
class EvalRequest:
    """What an evaluation needs from the trainer."""

    forward: Callable[[Any], Any]
    """One batch through the pipeline in evaluation mode -> the loss calculator's LossOutput."""
    model: torch.nn.Module
    """The user's model without wrappers (for generation)."""
    autocast: Callable
    pipeline: Any
    device: torch.device
    micro_batch_size: int
    eval_samples: int
    step: int
    run_dir: str
    """Where a task may write files: the run directory on rank 0, "" elsewhere."""


class DataMode:
    """The interface; see the module doc."""

    token_batches = True
    """Batches are token rows: the model takes input_ids/attention_mask (ditty.train.pipeline.call_model)."""

    def __init__(self, bundle: Any, config: Any, runtime: Any, tokenizer: Any) -> None:
        self.bundle = bundle
        self.config = config
        self.runtime = runtime
        self.tokenizer = tokenizer

    @property
    def train(self) -> Any:
        return self.bundle.train

    @property
    def val(self) -> Any:
        return getattr(self.bundle, "val", None)

    @property
    def task(self) -> Any:
        return getattr(self.bundle, "task", None)

    @property
    def skipped_rows(self) -> int:
        """Bad data rows left out (data.on_bad_rows = "skip"), counted in metrics and the summary."""
        return getattr(self.bundle, "skipped_rows", 0)

    @property
    def labels(self) -> Any:
        """The data's label set (a LabelSpace) when the model task classifies, else None."""
        return getattr(self.bundle, "labels", None)

    def stream(self, accumulation_steps: int) -> Any:
        raise NotImplementedError

    def train_samples(self) -> int:
        """Training samples per epoch."""
        return len(self.bundle.train)

    def supervised_count(self, batch: Any, loss: Any) -> torch.Tensor:
        """The loss's denominator for this batch, by the loss calculator's own rule when it has one."""
        raise NotImplementedError

    def input_count(self, batch: Any) -> torch.Tensor:
        """The `tokens` metric's increment for this batch."""
        raise NotImplementedError

    def evaluate(self, request: EvalRequest) -> dict[str, Any]:
        raise NotImplementedError


class TokenDataMode(DataMode):
    """Tokenized language-model rows, padded or packed by `BatchStream`; validation loss per token and
    the data's task metric (exact match by greedy generation)."""

    def stream(self, accumulation_steps: int) -> Any:
        """One source, a [[data.sources]] mixture or a stream (data.streaming), with data.num_workers;
        the seed is data.shuffle_seed, else run.seed (decided by build_data)."""
        from ditty.data.build import build_stream

        t = self.config.train
        return build_stream(
            self.bundle,
            self.config.data,
            global_batch_size=t.global_batch_size,
            micro_batch_size=t.micro_batch_size,
            rank=self.runtime.rank,
            world_size=self.runtime.world_size,
            pad_token_id=self.tokenizer.pad_token_id,
        )

    def supervised_count(self, batch: Any, loss: Any) -> torch.Tensor:
        from ditty.train.step import supervised_tokens

        counter = getattr(loss, "count_tokens", None)
        return counter(batch) if counter is not None else supervised_tokens(batch)

    def input_count(self, batch: Any) -> torch.Tensor:
        from ditty.train.step import input_tokens

        return input_tokens(batch, self.tokenizer.pad_token_id)

    def evaluate(self, request: EvalRequest) -> dict[str, Any]:
        from ditty.train.evaluate import eval_batches, validation_loss

        metrics: dict[str, Any] = {}
        val = self.val
        if val is not None and len(val) > 0:
            batches = eval_batches(val, request.micro_batch_size, self.tokenizer.pad_token_id)
            metrics["val_loss"] = validation_loss(
                request.forward, batches, lambda b: self.supervised_count(b, request.pipeline.loss)
            )
        val_sets = getattr(self.bundle, "val_sets", ())
        if val_sets:  # val_loss/NAME per held-out set, and val_loss over all of them
            from ditty.train.heldout import held_out_losses

            metrics.update(
                held_out_losses(
                    request.forward,
                    val_sets,
                    request.micro_batch_size,
                    self.tokenizer.pad_token_id,
                    lambda b: self.supervised_count(b, request.pipeline.loss),
                )
            )
        if metrics.get("val_loss") is not None:  # per-token loss of a language model: its perplexity too
            metrics["val_perplexity"] = math.exp(min(metrics["val_loss"], 700.0))
        if self.task is not None and request.eval_samples > 0:
            with request.autocast():
                scores = self.task.evaluate(request.model, self.tokenizer, request.device, request.eval_samples)
            metrics.update(_prefixed(scores))
        return metrics


class SampleDataMode(DataMode):
    """Any samples collated by a function (or a ready DataLoader); `tokens` counts samples; validation
    loss is the sample-weighted mean; the task (a diffusion sample grid, say) may write files."""

    token_batches = False

    @property
    def is_loader(self) -> bool:
        return self.bundle.is_loader

    def stream(self, accumulation_steps: int) -> Any:
        from ditty.data.generic import GenericStream, LoaderStream
        from ditty.data.iterable import IterableStream, is_iterable_only

        t, data = self.config.train, self.config.data
        if self.bundle.is_loader:
            return LoaderStream(self.bundle.train, accumulation_steps=accumulation_steps)
        geometry = dict(
            global_batch_size=t.global_batch_size,
            micro_batch_size=t.micro_batch_size,
            rank=self.runtime.rank,
            world_size=self.runtime.world_size,
            seed=self.bundle.seed,
            collate_fn=self.bundle.collate_fn,
        )
        if is_iterable_only(self.bundle.train):
            return IterableStream(self.bundle.train, shuffle_buffer_size=data.shuffle_buffer_size, **geometry)
        return GenericStream(
            self.bundle.train, num_workers=data.num_workers, prefetch_factor=data.prefetch_factor, **geometry
        )

    def train_samples(self) -> int:
        """A DataLoader counts its dataset's samples, not its batches; a stream cannot be counted."""
        from ditty.data.generic import loader_samples
        from ditty.data.iterable import is_iterable_only

        try:
            return loader_samples(self.bundle.train) if self.bundle.is_loader else len(self.bundle.train)
        except TypeError:  # an iterable dataset, or a DataLoader over one
            if is_iterable_only(self.bundle.train) or self.bundle.is_loader:
                raise RecipeError.single(
                    "an iterable dataset has no length, so epochs cannot be counted",
                    key="train.steps",
                    fix="set train.steps (Pipeline: max_steps=)",
                ) from None
            raise

    def supervised_count(self, batch: Any, loss: Any) -> torch.Tensor:
        counter = getattr(loss, "count_tokens", None)
        return counter(batch) if counter is not None else torch.tensor(batch_samples(batch))

    def input_count(self, batch: Any) -> torch.Tensor:
        return torch.tensor(batch_samples(batch))

    def evaluate(self, request: EvalRequest) -> dict[str, Any]:
        from ditty.data.generic import eval_micro_batches

        metrics: dict[str, Any] = {}
        val = self.val
        if val is not None and len(val) > 0:
            total, count = 0.0, 0
            for batch in eval_micro_batches(val, request.micro_batch_size, self.bundle.collate_fn):
                out = request.forward(batch)
                size = batch_samples(batch)
                total += float(out.mean_loss()) * size
                count += size
            metrics["val_loss"] = total / max(count, 1)
        if self.task is not None and request.eval_samples > 0:
            # Every rank runs the task (a sharded model's forward needs them all); rank 0 writes files.
            with request.autocast():
                scores = self.task.evaluate(
                    request.model,
                    device=request.device,
                    pipeline=request.pipeline,
                    run_dir=request.run_dir,
                    step=request.step,
                )
            metrics.update(_prefixed(scores))
        return metrics


def _prefixed(scores: dict[str, Any]) -> dict[str, Any]:
    return {k if k.startswith("val_") else f"val_{k}": v for k, v in scores.items()}


def build_data_mode(config: Any, runtime: Any, tokenizer: Any, components: Any) -> DataMode:
    """The recipe's [data] (token rows, or the built-in digits images), or the Python API's samples;
    rows of a model task's format (`model.task` other than causal-lm) go to TaskDataMode."""
    from dataclasses import replace

    from ditty.train.task_data_mode import build_task_data_mode, uses_task_mode

    if uses_task_mode(config, components):
        return build_task_data_mode(config, runtime, tokenizer, components)
    if components.has_data:
        from ditty.data.generic import GenericData

        seed = config.data.shuffle_seed if config.data.shuffle_seed is not None else config.run.seed
        bundle = GenericData(
            train=components.dataloader if components.dataloader is not None else components.dataset,
            val=components.val_dataset,
            task=components.task,
            seed=seed,
            collate_fn=components.collate_fn,
        )
        return SampleDataMode(bundle, config, runtime, tokenizer)
    from ditty.data import build_data
    from ditty.data.generic import is_generic

    bundle = build_data(config.data, tokenizer, config.run.seed)
    if is_generic(bundle):
        if components.task is not None:
            bundle = replace(bundle, task=components.task)
        return SampleDataMode(bundle, config, runtime, tokenizer)
    return TokenDataMode(bundle, config, runtime, tokenizer)
