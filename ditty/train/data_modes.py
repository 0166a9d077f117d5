"""The data mode: what the trainer does with its data, whatever the data is.

The data is a `DataBundle` (ditty.data.build): samples of a data format (ditty.data.formats) from
[data] or the Python API's rows, or the Python API's own samples with their collate function (or a
ready DataLoader, or an iterable dataset). The bundle's collator counts a batch (the loss's
denominator and the `tokens` metric: tokens for token formats, samples otherwise); the mode cuts
the global order into this rank's micro-batches (its stream) and evaluates. The trainer asks the
mode and never what the data is. A new data format is not a new mode: it is a `DataFormat`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import torch

from ditty.config.errors import RecipeError


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
    """See the module doc."""

    def __init__(self, bundle: Any, config: Any, runtime: Any, tokenizer: Any) -> None:
        self.bundle = bundle
        self.config = config
        self.runtime = runtime
        self.tokenizer = tokenizer

    @property
    def token_batches(self) -> bool:
        """Batches are token rows: the model takes input_ids/attention_mask (ditty.models.inputs.call_model)."""
        return self.bundle.collator.tokenized

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
        """The one global order (`build_stream`: one source, a mixture, a stream, with data.num_workers);
        a user's DataLoader keeps its own order, an iterable dataset is read as a stream. Under context
        parallel each rank then keeps its slice of every row (`ContextShardStream`)."""
        stream = self._global_stream(accumulation_steps)
        shape = getattr(self.runtime, "shape", None)
        if shape is not None and shape.cp > 1:
            pad = getattr(self.bundle.collator, "pad_token_id", None)
            if pad is None:
                pad = getattr(self.tokenizer, "pad_token_id", None) or 0
            return ContextShardStream(stream, self.runtime.coordinate("cp"), shape.cp, pad)
        return stream

    def _global_stream(self, accumulation_steps: int) -> Any:
        from ditty.data.build import build_stream
        from ditty.data.generic import LoaderStream
        from ditty.data.iterable import IterableStream, is_iterable_only

        t, data = self.config.train, self.config.data
        geometry = dict(
            global_batch_size=t.global_batch_size,
            micro_batch_size=t.micro_batch_size,
            # Tensor- and context-parallel ranks share rows: the data splits over the data-parallel ranks.
            rank=self.runtime.data_rank,
            world_size=self.runtime.data_world_size,
        )
        if isinstance(self.bundle.train, torch.utils.data.DataLoader):
            return LoaderStream(self.bundle.train, accumulation_steps=accumulation_steps)
        if is_iterable_only(self.bundle.train):
            return IterableStream(
                self.bundle.train,
                shuffle_buffer_size=data.shuffle_buffer_size,
                seed=self.bundle.seed,
                collate_fn=self.bundle.collator,
                **geometry,
            )
        return build_stream(self.bundle, data, **geometry)

    def train_samples(self) -> int:
        """Training samples per epoch. A DataLoader counts its dataset's samples, not its batches; a
        stream cannot be counted."""
        from ditty.data.generic import loader_samples
        from ditty.data.iterable import is_iterable_only

        train = self.bundle.train
        is_loader = isinstance(train, torch.utils.data.DataLoader)
        try:
            return loader_samples(train) if is_loader else len(train)
        except TypeError:  # an iterable dataset, or a DataLoader over one
            if is_iterable_only(train) or is_loader:
                raise RecipeError.single(
                    "an iterable dataset has no length, so epochs cannot be counted",
                    key="train.steps",
                    fix="set train.steps (Pipeline: max_steps=)",
                ) from None
            raise

    def supervised_count(self, batch: Any, loss: Any) -> Any:
        """The loss's denominator for this batch, by the loss calculator's own rule when it has one: the
        {unit: count} of a loss over global counts (ditty.stages.loss), else a token (or sample) count."""
        units = getattr(loss, "count_units", None)
        if units is not None:
            return units(batch)
        counter = getattr(loss, "count_tokens", None)
        return counter(batch) if counter is not None else self.bundle.collator.supervised_count(batch)

    def input_count(self, batch: Any) -> torch.Tensor:
        """The `tokens` metric's increment for this batch."""
        return self.bundle.collator.input_count(batch)

    def evaluate(self, request: EvalRequest) -> dict[str, Any]:
        """ditty.train.evaluate: every held-out set through the trainer's forward, then the model
        task's metrics and the data's hook."""
        from ditty.data.generic import SampleCollator
        from ditty.models.tasks import model_task
        from ditty.train.evaluate import evaluate_samples, evaluate_tokens

        if isinstance(self.bundle.collator, SampleCollator):
            return evaluate_samples(request, self.bundle)
        task = model_task(self.config.model.task)
        count = lambda batch: self.supervised_count(batch, request.pipeline.loss)  # noqa: E731
        return evaluate_tokens(request, self.bundle, task, self.tokenizer, count)


class ContextShardStream:
    """A stream whose micro-batches are cut to this context-parallel rank's slice of every row
    (ditty.data.context_shard); position, state and everything else are the wrapped stream's."""

    def __init__(self, stream: Any, rank: int, size: int, pad_token_id: int) -> None:
        self.stream, self.rank, self.size, self.pad_token_id = stream, rank, size, pad_token_id

    def next_step(self) -> list:
        from ditty.data.context_shard import shard_batch

        return [shard_batch(batch, self.rank, self.size, self.pad_token_id) for batch in self.stream.next_step()]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["stream"], name)


def build_data_mode(config: Any, runtime: Any, tokenizer: Any, components: Any) -> DataMode:
    """The recipe's [data] or the Python API's rows of a format (a model task other than causal LM),
    as samples of that format; or the Python API's samples and collate function."""
    if components.has_data and not takes_rows(config, components):
        from ditty.data.build import DataBundle
        from ditty.data.generic import SampleCollator, check_not_empty

        seed = config.data.shuffle_seed if config.data.shuffle_seed is not None else config.run.seed
        train = components.dataloader if components.dataloader is not None else components.dataset
        check_not_empty(train)
        bundle = DataBundle(
            train=train,
            val=components.val_dataset,
            task=None,
            seed=seed,
            collator=SampleCollator(components.collate_fn),
            hook=components.task,
        )
        return DataMode(bundle, config, runtime, tokenizer)
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
    from ditty.objectives.table import objective_for

    exact_match = config.data.val_exact_match  # unset: on after SFT, where a generation metric shows harm
    bundle = build_data(
        config.data,
        tokenizer,
        config.run.seed,
        label_hint=label_hint,
        decoder_start_token_id=start,
        rows=components.dataset if given else None,
        val_rows=components.val_dataset if given else None,
        exact_match=exact_match if exact_match is not None else objective_for(config).post_training,
    )
    if components.task is not None:  # the Python API's task= (an evaluation hook)
        bundle = replace(bundle, hook=components.task)
    if components.model is not None and bundle.labels is not None:
        fit_instance_labels(components.model, bundle.labels)
    return DataMode(bundle, config, runtime, tokenizer)


PROMPT_AND_PAIR_FORMATS = ("preference", "unpaired_preference", "prompt")


def takes_rows(config: Any, components: Any) -> bool:
    """The Python API's dataset holds rows of the task's format (ditty checks and tokenizes them), not
    samples for a collate function: a non-causal task, a dataset, and neither a loader nor a collate_fn."""
    from ditty.models.tasks import model_task
    from ditty.objectives.table import objective_name

    # An objective's data (preference pairs, RL prompts, a distillation's prompts and completions) is
    # rows of a format too, on a causal LM.
    row_format = objective_name(config) != "supervised" or config.data.format in PROMPT_AND_PAIR_FORMATS
    if not row_format and texts_to_tokenize(config, components.tokenizer, components.preprocessors):
        row_format = text_row_format(first_row(components.dataset), config.data) is not None
    return (
        (not model_task(config.model.task).token_rows or row_format)
        and components.dataset is not None
        and components.dataloader is None
        and components.collate_fn is None
    )


def texts_to_tokenize(config: Any, tokenizer: Any, preprocessors: Any) -> bool:
    """Rows of text are ditty's to tokenize when a tokenizer is known (the Hugging Face model's, or
    one given) and no preprocessor of the user's reads the batch (it may tokenize them itself)."""
    has_tokenizer = tokenizer is not None or bool(config.model.path or config.tokenizer.path)
    return has_tokenizer and not preprocessors


def first_row(dataset: Any) -> Any:
    """The dataset's first sample, or None when it cannot be indexed (a stream, an empty list)."""
    try:
        return dataset[0] if dataset is not None and len(dataset) else None
    except Exception:  # noqa: BLE001 - a peek only: any dataset may be given
        return None


def text_row_format(row: Any, data: Any) -> Optional[str]:
    """The causal-LM format of a row of text given to the Python API ("chat" for messages without a
    prompt, "prompt_completion", or "text"), which ditty tokenizes as the recipe's data; None for a
    sample of tokens (`input_ids`) or anything else, which goes to the collate function as it is."""
    if not isinstance(row, Mapping) or "input_ids" in row:
        return None
    if isinstance(row.get(data.messages_column), list) and data.prompt_column not in row:
        return "chat"
    if isinstance(row.get(data.prompt_column), str) and isinstance(row.get(data.completion_column), str):
        return "prompt_completion"
    if isinstance(row.get(data.text_column), str):
        return "text"
    return None
