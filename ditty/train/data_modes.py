"""Data modes: what the trainer does with one kind of data. One class per mode:

| mode             | data                                              | a batch                | `tokens` metric    |
|------------------|---------------------------------------------------|------------------------|--------------------|
| `TokenDataMode`  | samples of a data format (ditty.data.formats),    | the format's collator  | the format's count |
|                  | from `[data]` or the Python API's rows            |                        |                    |
| `SampleDataMode` | samples + a collate function: a Python API        | what `collate_fn` made | samples            |
|                  | dataset or DataLoader                             |                        |                    |

Each knows how to cut the global order into this rank's micro-batches (its stream), how to count a
batch (the loss's denominator and the `tokens` metric), and how to evaluate. The trainer asks the
mode and never which mode it is. A new data format is not a new mode: it is a `DataFormat`
(ditty.data.formats), which `TokenDataMode` reads through the bundle's collator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from ditty.config.errors import RecipeError
from ditty.data.generic import batch_samples


@dataclass
class EvalRequest:
    """What an evaluation needs from the trainer."""

    forward: Callable[[Any], Any]
    """One batch through the pipeline in evaluation mode -> (the loss calculator's LossOutput, the
    model's output after the postprocessors)."""
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
        return self.bundle.val

    @property
    def skipped_rows(self) -> int:
        """Bad data rows left out (data.on_bad_rows = "skip"), counted in metrics and the summary."""
        return self.bundle.skipped_rows

    @property
    def labels(self) -> Any:
        """The data's label set (a LabelSpace) when the model task classifies, else None."""
        return self.bundle.labels

    def stream(self, accumulation_steps: int) -> Any:
        raise NotImplementedError

    def train_samples(self) -> int:
        """Training samples per epoch."""
        return len(self.bundle.train)

    def supervised_count(self, batch: Any, loss: Any) -> torch.Tensor:
        """The loss's denominator for this batch, by the loss calculator's own rule when it has one."""
        counter = getattr(loss, "count_tokens", None)
        return counter(batch) if counter is not None else self.scored(batch)

    def scored(self, batch: Any) -> torch.Tensor:
        """The denominator of a loss without its own rule."""
        raise NotImplementedError

    def input_count(self, batch: Any) -> torch.Tensor:
        """The `tokens` metric's increment for this batch."""
        raise NotImplementedError

    def evaluate(self, request: EvalRequest) -> dict[str, Any]:
        raise NotImplementedError


class TokenDataMode(DataMode):
    """Samples of a data format (ditty.data.formats: causal-LM rows, a classifier's inputs and labels,
    seq2seq pairs, masked text, built-in images), from [data] or the Python API's rows. Batches come from
    the one global order (`build_stream`: one source, a mixture, a stream, with data.num_workers);
    the format's collator counts the loss's denominator and the `tokens` metric; evaluation is
    ditty.train.evaluate.evaluate_tokens."""

    @property
    def token_batches(self) -> bool:  # type: ignore[override]
        from ditty.data.formats import data_format

        return data_format(self.bundle.format).tokenized

    def stream(self, accumulation_steps: int) -> Any:
        from ditty.data.build import build_stream

        t = self.config.train
        return build_stream(
            self.bundle,
            self.config.data,
            global_batch_size=t.global_batch_size,
            micro_batch_size=t.micro_batch_size,
            rank=self.runtime.rank,
            world_size=self.runtime.world_size,
        )

    def scored(self, batch: Any) -> torch.Tensor:
        return self.bundle.collator.supervised_count(batch)

    def input_count(self, batch: Any) -> torch.Tensor:
        return self.bundle.collator.input_count(batch)

    def evaluate(self, request: EvalRequest) -> dict[str, Any]:
        from ditty.models.tasks import model_task
        from ditty.train.evaluate import evaluate_tokens

        task = model_task(self.config.model.task)
        count = lambda batch: self.supervised_count(batch, request.pipeline.loss)  # noqa: E731
        return evaluate_tokens(request, self.bundle, task, self.tokenizer, count)


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
        stream = GenericStream(self.bundle.train, **geometry)
        if data.num_workers > 0:
            from ditty.data.workers import PrefetchedStream

            return PrefetchedStream(stream, num_workers=data.num_workers, prefetch_factor=data.prefetch_factor)
        return stream

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

    def scored(self, batch: Any) -> torch.Tensor:
        return torch.tensor(batch_samples(batch))

    def input_count(self, batch: Any) -> torch.Tensor:
        return torch.tensor(batch_samples(batch))

    def evaluate(self, request: EvalRequest) -> dict[str, Any]:
        from ditty.data.generic import eval_micro_batches
        from ditty.train.evaluate import hook_scores

        metrics: dict[str, Any] = {}
        val = self.bundle.val
        if val is not None and len(val) > 0:
            total, count = 0.0, 0
            for batch in eval_micro_batches(val, request.micro_batch_size, self.bundle.collate_fn):
                out, _ = request.forward(batch)
                size = batch_samples(batch)
                total += float(out.mean_loss()) * size
                count += size
            metrics["val_loss"] = total / max(count, 1)
        return metrics | hook_scores(self.bundle.task, request)


def build_data_mode(config: Any, runtime: Any, tokenizer: Any, components: Any) -> DataMode:
    """The recipe's [data] or the Python API's rows of a format (a model task other than causal LM),
    as samples of that format; or the Python API's samples and collate function."""
    if components.has_data and not takes_rows(config, components):
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
    from ditty.data.build import build_data
    from ditty.data.formats import format_of
    from ditty.models.task_facts import fit_instance_labels, model_facts

    if tokenizer is None and format_of(config.data).tokenized:
        raise RecipeError.single(
            f'model.task = "{config.model.task}" reads text, and there is no tokenizer',
            key="tokenizer.path",
            fix="set tokenizer.path (or model.path), or pass tokenizer= to the Pipeline",
        )
    label_hint, start = model_facts(config.model, components.model, tokenizer)
    given = components.has_data
    bundle = build_data(
        config.data,
        tokenizer,
        config.run.seed,
        label_hint=label_hint,
        decoder_start_token_id=start,
        rows=components.dataset if given else None,
        val_rows=components.val_dataset if given else None,
    )
    if components.task is not None:  # the Python API's task= (an evaluation hook)
        bundle = replace(bundle, hook=components.task)
    if components.model is not None and bundle.labels is not None:
        fit_instance_labels(components.model, bundle.labels)
    return TokenDataMode(bundle, config, runtime, tokenizer)


def takes_rows(config: Any, components: Any) -> bool:
    """The Python API's dataset holds rows of the task's format (ditty checks and tokenizes them), not
    samples for a collate function: a non-causal task, a dataset, and neither a loader nor a collate_fn."""
    from ditty.models.tasks import model_task

    # Preference pairs and RL prompts are rows of a format too, on a causal LM.
    row_format = config.data.format in ("preference", "unpaired_preference", "prompt")
    return (
        (not model_task(config.model.task).token_rows or row_format)
        and components.dataset is not None
        and components.dataloader is None
        and components.collate_fn is None
    )
