"""`build_data`: from the [data] section and a tokenizer to tokenized training and validation sets."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Optional

from ditty.config.errors import RecipeError
from ditty.data import builtin
from ditty.data.formats import tokenize_dataset
from ditty.data.rows import DEFAULT_MAX_ROW_BYTES, required_fields
from ditty.data.sources import load_checked_files, load_checked_hub_dataset, progress_bars_on_main_rank
from ditty.data.task import Task

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from ditty.config.sections import DataConfig


IMAGE_BUILTINS = ("digits",)
"""Built-in datasets of images rather than text (ditty.data.digits); they yield `GenericData`."""


@dataclass(frozen=True)
class DataBundle:
    """What the trainer trains and evaluates on. Samples are {"input_ids", "labels"} (-100: no loss)."""

    train: "Dataset"
    val: Optional["Dataset"]
    task: Optional[Task]
    """A metric beyond validation loss (built-in datasets: greedy exact match), or None."""
    seed: int
    """The data-order seed (`data.shuffle_seed`, else the run seed): give it to `BatchStream`."""
    skipped_rows: int = 0
    """Bad rows left out under `data.on_bad_rows = "skip"` (training and validation files together)."""
    val_sets: tuple[tuple[str, "Dataset"], ...] = ()
    """Named held-out sets (per source of [[data.sources]], and [data.eval]), each validated and
    reported on its own (`val_loss/NAME`); when there are any, `val` is None."""


def build_data(data: "DataConfig", tokenizer: "PreTrainedTokenizerBase", seed: int) -> DataBundle:
    """Load, tokenize and split the data the recipe names.

    Validation comes from `data.val_path` when set, else a `data.val_fraction` split that is
    deterministic in the seed; built-in datasets hold out whole problems instead (see `builtin`).
    Progress bars show on rank 0 only.
    """
    with progress_bars_on_main_rank():
        return _build(data, tokenizer, seed)


def _build(data: "DataConfig", tokenizer: "PreTrainedTokenizerBase", seed: int) -> DataBundle:
    seed = data.shuffle_seed if data.shuffle_seed is not None else seed
    if data.sources or data.streaming or data.eval.source != "none":
        from ditty.data.multisource import build_sources

        return build_sources(data, tokenizer, seed)
    return build_single_source(data, tokenizer, seed)


def build_single_source(data: "DataConfig", tokenizer: "PreTrainedTokenizerBase", seed: int) -> DataBundle:
    """One source read up front: [data] as it names it (`seed` is already the data seed)."""
    if data.source == "builtin" and data.name in IMAGE_BUILTINS:
        from ditty.data.digits import build_digits  # generic (non-LM) data: no tokenizer involved

        return build_digits(data.val_fraction, seed)
    if data.source == "builtin":
        return _build_builtin(data, tokenizer, seed)

    checks = dict(
        fields=required_fields(data),
        on_bad_rows=getattr(data, "on_bad_rows", "error"),
        max_row_bytes=getattr(data, "max_row_bytes", DEFAULT_MAX_ROW_BYTES),
    )
    if data.source == "file":
        raw, skipped = load_checked_files(data.path, key="data.path", cache_dir=data.cache_dir, **checks)
        source_key = "data.path"
    else:
        checks.pop("max_row_bytes")
        raw, skipped = load_checked_hub_dataset(data.name, split=data.split, cache_dir=data.cache_dir, **checks)
        source_key = "data.name"
    train = tokenize_dataset(raw, tokenizer, data, source_key=source_key)

    val = None
    if data.val_path:
        checks["max_row_bytes"] = getattr(data, "max_row_bytes", DEFAULT_MAX_ROW_BYTES)
        raw_val, skipped_val = load_checked_files(
            data.val_path, key="data.val_path", cache_dir=data.cache_dir, **checks
        )
        skipped += skipped_val
        val = tokenize_dataset(raw_val, tokenizer, data, source_key="data.val_path")
    elif data.val_fraction > 0:
        train, val = _split_off_validation(train, data.val_fraction, seed)
    return DataBundle(train=train, val=val, task=None, seed=seed, skipped_rows=skipped)


def _split_off_validation(dataset: "Dataset", fraction: float, seed: int) -> tuple["Dataset", "Dataset"]:
    # At least one validation sample, so a small fraction of a small file still validates.
    val_size = max(1, round(len(dataset) * fraction))
    if val_size >= len(dataset):
        raise RecipeError.single(
            f"holding out {fraction} of {len(dataset)} samples leaves nothing to train on",
            key="data.val_fraction",
            fix="lower data.val_fraction (0 disables validation), or give a data.val_path",
        )
    split = dataset.train_test_split(test_size=val_size, shuffle=True, seed=seed)
    return split["train"], split["test"]


def _build_builtin(data: "DataConfig", tokenizer: "PreTrainedTokenizerBase", seed: int) -> DataBundle:
    from datasets import Dataset

    if data.name not in builtin.GENERATORS:
        raise RecipeError.single(
            f"unknown built-in dataset {data.name!r}",
            key="data.name",
            fix=f"use one of {', '.join((*builtin.GENERATORS, *IMAGE_BUILTINS))}",
        )
    if data.format != "prompt_completion":
        raise RecipeError.single(
            f'built-in datasets are prompt/completion pairs, not data.format = "{data.format}"',
            key="data.format",
            fix='set data.format = "prompt_completion"',
        )
    train_problems, held_out = builtin.split_problems(
        builtin.generate_problems(data.name, data.num_samples), data.val_fraction
    )
    # The generated columns have fixed names, whatever the recipe's column settings say.
    columns = replace(data, prompt_column="prompt", completion_column="completion")

    def as_dataset(problems: list[builtin.Problem]) -> "Dataset":
        prompts, completions = zip(*problems) if problems else ((), ())
        return Dataset.from_dict({"prompt": list(prompts), "completion": list(completions)})

    train = tokenize_dataset(as_dataset(train_problems), tokenizer, columns, source_key="data.num_samples")
    if not held_out:
        return DataBundle(train=train, val=None, task=None, seed=seed)

    val = tokenize_dataset(as_dataset(held_out), tokenizer, columns, source_key="data.val_fraction")
    answers = tuple(completion for _, completion in held_out)
    longest_answer = max(len(ids) for ids in tokenizer(list(answers), add_special_tokens=False)["input_ids"])
    task = Task(
        name=data.name,
        prompts=tuple(prompt for prompt, _ in held_out),
        answers=answers,
        max_new_tokens=longest_answer + 1,  # + the end-of-sequence token
    )
    return DataBundle(train=train, val=val, task=task, seed=seed)


def build_stream(
    bundle: DataBundle,
    data: "DataConfig",
    *,
    global_batch_size: int,
    micro_batch_size: int,
    rank: int,
    world_size: int,
    pad_token_id: int,
) -> Any:
    """The trainer's stream over a token `DataBundle`: `next_step()`, `cursor`, `state_dict()` and
    `load_state_dict()` (and `source_tokens()` for several sources); with `data.num_workers`, its
    batches are prepared by dataloader workers."""
    from ditty.data.batching import BatchStream
    from ditty.data.mixture import MixtureData, MixtureStream
    from ditty.data.streaming import StreamingData
    from ditty.data.workers import PrefetchedStream, StreamingBatches

    common = dict(
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        rank=rank,
        world_size=world_size,
        seed=bundle.seed,
        packing=data.packing,
        max_seq_len=data.max_seq_len,
        pad_token_id=pad_token_id,
    )
    if isinstance(bundle.train, StreamingData):
        return StreamingBatches(
            bundle.train, num_workers=data.num_workers, prefetch_factor=data.prefetch_factor, **common
        )
    if isinstance(bundle.train, MixtureData):
        stream = MixtureStream(bundle.train, **common)
    else:
        stream = BatchStream(bundle.train, group_by_length=data.group_by_length, **common)
    if data.num_workers > 0:
        return PrefetchedStream(stream, num_workers=data.num_workers, prefetch_factor=data.prefetch_factor)
    return stream
