"""`build_data`: from the [data] section and a tokenizer to training and held-out samples, for every format.

One path for all formats (ditty.data.formats): each source ([data] itself, or each of
[[data.sources]]) is read and its rows checked by the format (ditty.data.sources: bad rows are an
error naming file and line, or left out and counted); validation is the source's `val_path`, else a
seeded `val_fraction` split (built-in datasets hold out whole problems instead, see `builtin`); a
classifying format takes its label set from all training rows (validation labels must be among
them); then every set is tokenized. Several sources mix by tokens (`MixtureData`); `data.streaming`
only describes the sources (`StreamingData`), which the readers open themselves. Held-out sets of
[[data.sources]], of a stream and of [data.eval] are each validated and reported on their own.
Progress bars show on rank 0 only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from ditty.config.errors import RecipeError
from ditty.data import builtin
from ditty.data.formats import IMAGE_BUILTINS, data_format, format_of, tokenize, tokenize_counted
from ditty.data.labels import LabelSpace
from ditty.data.mixture import MixtureData, ResolvedSource, resolve_sources
from ditty.data.sources import load_checked_files, load_checked_hub_dataset, progress_bars_on_main_rank
from ditty.data.task import Task

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from ditty.config.sections import DataConfig


@dataclass(frozen=True)
class DataBundle:
    """What the trainer trains and evaluates on: samples of one format (ditty.data.formats)."""

    train: Any
    """A `datasets.Dataset`, a `MixtureData` of several, or a `StreamingData`."""
    val: Optional["Dataset"]
    task: Optional[Task]
    """A metric beyond validation loss (built-in prompt/completion datasets: greedy exact match), or None."""
    seed: int
    """The data-order seed (`data.shuffle_seed`, else the run seed)."""
    skipped_rows: int = 0
    """Bad rows left out under `data.on_bad_rows = "skip"` (every file read up front, counted once)."""
    val_sets: tuple[tuple[str, "Dataset"], ...] = ()
    """Named held-out sets (per source of [[data.sources]], and [data.eval]), each validated and
    reported on its own (`val_loss/NAME`); when there are any, `val` is None."""
    collator: Any = None
    """Samples -> micro-batch (the format's collator)."""
    labels: Optional[LabelSpace] = None
    """The label set of a classifying format."""
    format: str = "prompt_completion"
    hook: Any = None
    """An evaluation hook beside the loss (ditty.data.generic.GenericTask: the digits' sample grid)."""


@dataclass(frozen=True)
class SourceRows:
    """One source's checked rows, before tokenizing."""

    train: "Dataset"
    val: Optional["Dataset"]
    skipped: int
    val_what: str = ""
    """The validation rows' file, for messages ("" for a split)."""
    val_key: str = ""
    task: Optional[Task] = None
    hook: Any = None


def build_data(
    data: "DataConfig",
    tokenizer: "PreTrainedTokenizerBase",
    seed: int,
    *,
    label_hint: Optional[Sequence[str]] = None,
    decoder_start_token_id: Optional[int] = None,
    rows: Any = None,
    val_rows: Any = None,
    exact_match: Optional[bool] = None,
) -> DataBundle:
    """Load, check, label, split and tokenize the data the recipe names (or the Python API's `rows`,
    a list of dicts or a `datasets.Dataset`, and `val_rows`).

    `label_hint`: a pretrained classifier's label names (kept when they cover the data);
    `decoder_start_token_id`: the seq2seq model's (the collator shifts labels behind it);
    `exact_match`: score held-out rows by greedy exact match against their answers (the caller's
    resolution of `data.val_exact_match`; None reads it as given, unset meaning no).
    """
    seed = data.shuffle_seed if data.shuffle_seed is not None else seed
    fmt = format_of(data)
    collator = fmt.collator(tokenizer, data, seed=seed, decoder_start_token_id=decoder_start_token_id)
    with progress_bars_on_main_rank():
        if data.streaming:
            return _streamed(data, tokenizer, seed, label_hint, collator)
        sources = resolve_sources(data)
        if rows is not None:
            read = [_given_rows(data, seed, rows, val_rows)]
        else:
            read = [read_source(source, seed) for source in sources]
        wanted = bool(data.val_exact_match) if exact_match is None else exact_match
        if read[0].task is None and wanted and read[0].val is not None and not data.sources:
            read[0] = replace(read[0], task=fmt.exact_match_task(read[0].val, data, tokenizer))
        if read[0].task is not None:  # greedy decoding generates the longest answer and its eos
            answers = tokenizer(list(read[0].task.answers), add_special_tokens=False)["input_ids"]
            read[0] = replace(read[0], task=replace(read[0].task, max_new_tokens=max(map(len, answers)) + 1))
        labels = _label_space(fmt, (fmt.label_values(r.train, data) for r in read), label_hint)
        for s, r in zip(sources, read):  # every label problem before any tokenizing
            if labels is not None and r.val is not None:
                fmt.check_labels_known(r.val, s.data, labels, r.val_what or s.key, r.val_key or s.key)
        trains, vals, skipped = [], [], sum(r.skipped for r in read)
        for s, r in zip(sources, read):  # samples the cut to max_seq_len leaves unusable are bad rows too
            named = _described(s)  # which data a missing column or an empty set is in
            train, unusable = tokenize_counted(
                r.train, tokenizer, s.data, source_key=_key(s, "path"), description=named, labels=labels
            )
            val_named = f"the held-out rows of {r.val_what!r}" if r.val_what else f"the held-out part of {named}"
            val, unusable_val = (
                tokenize_counted(
                    r.val,
                    tokenizer,
                    s.data,
                    source_key=r.val_key or _key(s, "val_fraction"),
                    description=val_named,
                    labels=labels,
                )
                if r.val is not None
                else (None, 0)
            )
            format_of(s.data).check_training_set(train, s.data, _key(s, "path"))
            trains.append(train)
            vals.append(val)
            skipped += unusable + unusable_val
        common = dict(seed=seed, skipped_rows=skipped, collator=collator, labels=labels, format=fmt.name)
        if not (data.sources or data.eval.source != "none"):
            return DataBundle(train=trains[0], val=vals[0], task=read[0].task, hook=read[0].hook, **common)
        held_out = [(s.label, v) for s, v in zip(sources, vals) if v is not None]
        held_out += _eval_sets(data, tokenizer, labels)
        train = (
            trains[0]
            if not data.sources
            else MixtureData(trains, [s.label for s in sources], [s.weight for s in sources])
        )
        return DataBundle(
            train=train, val=None, task=None if data.sources else read[0].task, val_sets=tuple(held_out), **common
        )


def _described(source: ResolvedSource) -> str:
    """The data of one source in messages: its file or dataset, and the key that names it."""
    data = source.data
    where = data.path if data.source == "file" else data.name
    return f"{where!r} ({_key(source, 'path')})" if where else "the data"


def _key(source: ResolvedSource, name: str) -> str:
    data = source.data
    if data.source == "builtin":
        return f"{source.key}.num_samples" if name == "path" else f"{source.key}.val_fraction"
    if name == "path" and data.source == "hub":
        return f"{source.key}.name" if source.key == "data" else f"{source.key}.dataset"
    return f"{source.key}.{name}"


def read_source(source: ResolvedSource, seed: int) -> SourceRows:
    """One source's rows, checked by its format, and its validation rows."""
    data = source.data
    if data.source == "builtin":
        return format_of(data).read_builtin(data, seed)
    if data.source == "file":
        train, skipped = _checked(data, key=_key(source, "path"), path=data.path)
    else:
        train, skipped = _checked(data, key=_key(source, "path"), hub=data.name, split=data.split)
    if data.val_path:
        key = f"{source.key}.val_path"
        val, skipped_val = _checked(data, key=key, path=data.val_path)
        return SourceRows(train, val, skipped + skipped_val, val_what=data.val_path, val_key=key)
    train, val = split_validation(train, data.val_fraction, seed, key=f"{source.key}.val_fraction")
    return SourceRows(train, val, skipped)


def _checked(data: "DataConfig", *, key: str, path: Optional[str] = None, hub: str = "", split: str = "train"):
    """(rows, bad rows left out) of the files `path` (a path or glob) or the hub dataset `hub`, each
    row checked by `data`'s format."""
    check = format_of(data).row_check(data)
    reading = dict(cache_dir=data.cache_dir, fields=check, on_bad_rows=data.on_bad_rows)
    if path is not None:
        return load_checked_files(path, key=key, max_row_bytes=data.max_row_bytes, **reading)
    return load_checked_hub_dataset(hub, split=split, **reading)


def _held_out(raw: "Dataset", data: "DataConfig", tokenizer: Any, labels: Optional[LabelSpace], what: str, key: str):
    """Held-out rows tokenized, their labels checked against training's (a classifying format)."""
    if labels is not None:
        format_of(data).check_labels_known(raw, data, labels, what, key)
    return tokenize(raw, tokenizer, data, source_key=key, labels=labels)


def _given_rows(data: "DataConfig", seed: int, rows: Any, val_rows: Any) -> SourceRows:
    """The Python API's rows (a list of dicts or a `datasets.Dataset`), checked as a file's are."""
    from ditty.data.rows import require_columns
    from ditty.data.sources import checked_table

    fmt = data_format(data.format)
    check = fmt.row_check(data)
    given = _as_dataset(rows)
    if len(given):  # a column no row has is named here, before the format's steps read it
        require_columns(given, fmt.columns_found(data, given.column_names), "the training dataset", "dataset")
    train, skipped = checked_table(given, check, "the training dataset", "dataset", data.on_bad_rows)
    if val_rows is None:
        train, val = split_validation(train, data.val_fraction, seed, key="data.val_fraction")
        return SourceRows(train, val, skipped)
    val, skipped_val = checked_table(
        _as_dataset(val_rows), check, "the validation dataset", "val_dataset", data.on_bad_rows
    )
    return SourceRows(train, val, skipped + skipped_val, "the validation dataset", "val_dataset")


def _as_dataset(rows: Any) -> "Dataset":
    from datasets import Dataset

    if isinstance(rows, Dataset):
        return rows
    try:
        return Dataset.from_list(list(rows))
    except (TypeError, ValueError) as error:
        raise RecipeError.single(
            f"the rows cannot be read as a table: {error}",
            key="dataset",
            fix="give a list of dicts (one per row) or a datasets.Dataset",
        ) from error


def split_validation(
    dataset: "Dataset", fraction: float, seed: int, *, key: str = "data.val_fraction"
) -> tuple["Dataset", Optional["Dataset"]]:
    """A seeded `fraction` of the rows held out (at least one, so a small fraction of a small file
    still validates); the rest trains. No split for a fraction of 0."""
    if fraction <= 0:
        return dataset, None
    val_size = max(1, round(len(dataset) * fraction))
    if val_size >= len(dataset):
        raise RecipeError.single(
            f"holding out {fraction} of {len(dataset)} samples leaves nothing to train on",
            key=key,
            fix="lower data.val_fraction (0 disables validation), or give a data.val_path",
        )
    split = dataset.train_test_split(test_size=val_size, shuffle=True, seed=seed)
    return split["train"], split["test"]


def builtin_rows(data: "DataConfig") -> SourceRows:
    """A generated dataset, read as one of the formats its pairs fit; held out by whole problems.
    Read as prompt/completion, its held-out problems are also scored by greedy exact match (`Task`)."""
    from datasets import Dataset

    if data.name not in builtin.GENERATORS:
        raise RecipeError.single(
            f"unknown built-in dataset {data.name!r}",
            key="data.name",
            fix=f"use one of {', '.join((*builtin.GENERATORS, *IMAGE_BUILTINS))}",
        )
    if data.format not in builtin.FORMATS[data.name]:
        raise RecipeError.single(
            f'the built-in {data.name!r} dataset cannot be read as data.format = "{data.format}"',
            key="data.format",
            fix=f"use data.format = one of {', '.join(builtin.FORMATS[data.name])}, or another data.name",
        )
    columns = list(data_format(data.format).columns(data).values())[:2]
    if data.format == "prompt":  # the answer stays a column, for the reward functions
        columns.append("completion")
    train_problems, held_out = builtin.split_problems(
        builtin.generate_problems(data.name, data.num_samples), data.val_fraction
    )

    def as_rows(problems: list) -> "Dataset":
        if data.format == "chat":  # one demonstration conversation per problem
            return Dataset.from_dict({columns[0]: [builtin.DEMONSTRATIONS[data.name](p, a) for p, a in problems]})
        first, second = zip(*problems) if problems else ((), ())
        rows = {columns[0]: list(first), columns[1]: list(second)}
        if data.format == "preference":  # the correct sum is chosen, a wrong one rejected
            rows["rejected"] = [builtin.wrong_answer(p, a) for p, a in problems]
        return Dataset.from_dict(rows)

    val = as_rows(held_out) if held_out else None
    task = None
    if val is not None and data.format in ("prompt_completion", "preference", "prompt"):
        task = Task(
            name=data.name,
            prompts=tuple(prompt for prompt, _ in held_out),
            answers=tuple(completion for _, completion in held_out),
            max_new_tokens=0,  # set by build_data, which has the tokenizer
        )
    return SourceRows(as_rows(train_problems), val, 0, task=task)


def _label_space(fmt: Any, value_sets: Iterable[set], hint: Optional[Sequence[str]]) -> Optional[LabelSpace]:
    """The label set of all training rows, from each source's label values (read only for a
    classifying format), else None."""
    if not fmt.labels:
        return None
    values = set().union(*value_sets)
    return LabelSpace.from_values(values, hint) if values else None


def _eval_settings(data: "DataConfig") -> "DataConfig":
    """[data] as [data.eval] reads it: its keys where set, [data]'s where not."""
    spec = data.eval
    columns = {
        name: getattr(spec, name) if getattr(spec, name) is not None else getattr(data, name)
        for name in ("format", "text_column", "prompt_column", "completion_column", "messages_column")
    }
    return replace(data, sources=[], **columns)


def _eval_sets(data: "DataConfig", tokenizer: Any, labels: Optional[LabelSpace]) -> list[tuple[str, "Dataset"]]:
    """[data.eval]'s rows, checked, tokenized in its format, labels checked against training's."""
    spec = data.eval
    if spec.source == "none":
        return []
    settings = _eval_settings(data)
    if spec.source == "file":
        key = "data.eval.path"
        raw, _ = _checked(settings, key=key, path=spec.path)
    else:
        key = "data.eval.dataset"
        raw, _ = _checked(settings, key=key, hub=spec.dataset, split=spec.split)
    return [(spec.name, _held_out(raw, settings, tokenizer, labels, spec.path or spec.dataset, key))]


def _streamed(
    data: "DataConfig", tokenizer: Any, seed: int, hint: Optional[Sequence[str]], collator: Any
) -> DataBundle:
    """`data.streaming`: the sources described for the readers; held-out sets read up front (a
    held-out set is small, and read whole at every evaluation). A classifying format reads the label
    column of every source once first: the model's head is sized before training starts."""
    from ditty.data.streaming import StreamingData, label_values_of

    fmt = data_format(data.format)
    sources = resolve_sources(data)
    labels = _label_space(fmt, (label_values_of(source, fmt, data.cache_dir) for source in sources), hint)
    train = StreamingData(
        tuple(sources),
        tokenizer,
        window=data.shuffle_buffer_size,
        cache_dir=data.cache_dir,
        report_sources=bool(data.sources),
        labels=labels,
        on_bad_rows=data.on_bad_rows,
    )
    held_out = []
    skipped = 0
    for source in (s for s in sources if s.data.val_path):
        key = f"{source.key}.val_path"
        raw, count = _checked(source.data, key=key, path=source.data.val_path)
        held_out.append((source.label, _held_out(raw, source.data, tokenizer, labels, source.data.val_path, key)))
        skipped += count
    held_out += _eval_sets(data, tokenizer, labels)
    return DataBundle(
        train=train, val=None, task=None, seed=seed, skipped_rows=skipped, val_sets=tuple(held_out),
        collator=collator, labels=labels, format=data.format,
    )  # fmt: skip


def build_stream(
    bundle: DataBundle,
    data: "DataConfig",
    *,
    global_batch_size: int,
    micro_batch_size: int,
    rank: int,
    world_size: int,
) -> Any:
    """The trainer's stream over a `DataBundle`: `next_step()`, `cursor`, `state_dict()` and
    `load_state_dict()` (and `source_tokens()` for several sources); with `data.num_workers`, its
    batches are prepared by dataloader workers."""
    from ditty.data.batching import BatchStream
    from ditty.data.mixture import MixtureStream
    from ditty.data.streaming import StreamingData
    from ditty.data.workers import PrefetchedStream, StreamingBatches

    tokens = bundle.collator.tokenized  # images and the Python API's samples neither pack nor group by length
    common = dict(
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        rank=rank,
        world_size=world_size,
        seed=bundle.seed,
        packing=data.packing and tokens,
        max_seq_len=data.max_seq_len,
        collator=bundle.collator,
    )
    if isinstance(bundle.train, StreamingData):
        return StreamingBatches(
            bundle.train, num_workers=data.num_workers, prefetch_factor=data.prefetch_factor, **common
        )
    if isinstance(bundle.train, MixtureData):
        stream = MixtureStream(bundle.train, **common)
    else:
        stream = BatchStream(bundle.train, group_by_length=data.group_by_length and tokens, measure=tokens, **common)
    if data.num_workers > 0:
        return PrefetchedStream(stream, num_workers=data.num_workers, prefetch_factor=data.prefetch_factor)
    return stream
