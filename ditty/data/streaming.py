"""Streaming sources (`data.streaming`): rows read lazily, tokenized, mixed and packed on the fly.

Readers. Each rank, and each dataloader worker of a rank, is one READER: R = world size x
max(1, num_workers) of them, reader j = rank x max(1, num_workers) + worker. A reader sees a
disjoint share of every source's rows, `datasets.distributed.split_dataset_by_node(rows, rank=j,
world_size=R)`: whole files (shards) when their count is a multiple of R, else every R-th row, in
which case each reader reads all rows and keeps its own (R times the reading, none of the
tokenizing; give a multiple of R files to avoid it). Together the readers see every row once per
pass, with no gap and no overlap.

Shuffle buffer. A reader reads `data.shuffle_buffer_size` rows at a time (a window), tokenizes them
together and takes the samples in an order drawn from (seed, source, reader, pass, window). Its
position is small: the `datasets` state at the window's start (from which
`IterableDataset.load_state_dict` resumes exactly at that batch boundary), the window's number and
how many of its samples were taken. A resume re-reads and re-tokenizes that one window. (A
reservoir buffer, as `IterableDataset.shuffle` keeps, would have to be saved whole; `datasets`
does not save it and refills it with other rows on resume, so its resumes are not exact.) Each
pass over a source calls `set_epoch`, which reorders its files.

Mixing and packing. A reader's `TokenMixer` picks the source of each sample (ditty/data/mixture.py);
rows pack greedily as in `BatchStream` (a row closes when the next sample does not fit), and
`micro_batch_size` rows make a micro-batch. Memory per reader: one window per source plus the
`datasets` reader's own read-ahead, whatever the size of the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

from ditty._utils.errors import condensed
from ditty.config.errors import RecipeError
from ditty.data.formats.base import CUT_PROBLEM
from ditty.data.mixture import ResolvedSource, TokenMixer
from ditty.data.row_files import SKIPPED_BEFORE

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


READ_AHEAD = {"json": {"chunksize": 1 << 20}, "text": {"chunksize": 1 << 20}}
"""Bytes `datasets` reads (and parses into one Arrow table) at a time from a JSON or text file; its
default, 10 MiB, is held per source per reader. Fixed: a resume counts position in these chunks."""


@dataclass(frozen=True)
class StreamingData:
    """What a streaming run trains on: the sources to open in each reader. It has no length (a
    stream is not counted before it is read), so streaming runs set `train.steps`."""

    sources: tuple[ResolvedSource, ...]
    tokenizer: "PreTrainedTokenizerBase"
    window: int
    """Rows per shuffle window (`data.shuffle_buffer_size`)."""
    cache_dir: Optional[str] = None
    report_sources: bool = True
    """Report `tokens/source/NAME` ([[data.sources]] given), not for a single [data] source."""
    labels: Any = None
    """The label set of a classifying format (read from the sources before training)."""
    on_bad_rows: str = "error"

    def __len__(self) -> int:
        raise RecipeError.single(
            "a streamed dataset has no length before it is read, so train.epochs cannot be counted",
            key="train.steps",
            fix="set train.steps for data.streaming = true",
        )


def open_rows(source: ResolvedSource, cache_dir: Optional[str]):
    """The source's rows as a `datasets.IterableDataset` (nothing is read yet)."""
    from ditty.data.sources import load_file_dataset, load_hub_dataset

    data = source.data
    if data.source == "file":
        return load_file_dataset(
            data.path,
            key=f"{source.key}.path",
            cache_dir=cache_dir,
            streaming=True,
            reader_options=READ_AHEAD,
            on_bad_rows=data.on_bad_rows,
            max_row_bytes=data.max_row_bytes,
        )
    if data.source == "hub":
        return load_hub_dataset(data.name, split=data.split, cache_dir=cache_dir, streaming=True)
    raise RecipeError.single(
        f'data.streaming reads files or hub datasets, not data.source = "{data.source}"',
        key=f"{source.key}.source",
        fix='use source = "file" or "hub", or data.streaming = false',
    )


def label_values_of(source: ResolvedSource, fmt: Any, cache_dir: Optional[str]) -> set:
    """The label values of a streamed source: one read of the whole source before training (a
    classifier's head is sized by them). Rows the format cannot use are left to the readers."""
    from ditty.data.rows import row_problem

    check = fmt.row_check(source.data)
    values: set = set()
    try:
        for rows in open_rows(source, cache_dir).iter(batch_size=1000):
            names = list(rows)
            good = [dict(zip(names, v)) for v in zip(*rows.values()) if row_problem(dict(zip(names, v)), check) is None]
            if good:
                values |= fmt.label_values(good, source.data)
    except RecipeError:
        raise
    except Exception as error:  # noqa: BLE001 - the reader's parse error is the user's data
        raise RecipeError.single(
            f"cannot read source {source.label!r} for its labels: {type(error).__name__}: {condensed(error)}",
            key=source.key if source.key != "data" else "data.path",
            fix="fix or remove that row; with data.streaming = false every bad row is named by file and line",
        ) from None
    return values


class SourceReader:
    """One source's samples for one reader: its share of the rows, window by window (module doc)."""

    def __init__(self, source: ResolvedSource, data: StreamingData, *, reader: int, readers: int, seed: int) -> None:
        from ditty.data.formats import data_format

        fmt = data_format(source.data.format)
        self.source = source
        self.data = data
        self.reader, self.readers, self.seed = reader, readers, seed
        self.format, self.encode = fmt, fmt.encoder(data.tokenizer, source.data, data.labels)
        self.check = fmt.row_check(source.data)
        self.epoch = 0
        self.window = -1  # number of the window in `samples` within this pass; -1: none read yet
        self.window_start: Any = None  # `datasets` state at that window's start; None: the start of the pass
        self.offset = 0  # samples of the window already taken
        self.samples: list[dict] = []
        self._rows = None
        self._windows = None
        self._next_start: Any = None
        self._resume: Optional[dict] = None
        self._pass_from_start = True
        self._pass_samples = 0
        self.skipped_before = 0
        """Bad rows left out (data.on_bad_rows = "skip") in the windows before the current one."""
        self.window_skipped = 0
        """Bad rows left out of the current window (counted again when it is read again on a resume).
        Only the first pass counts: later ones leave out the same rows."""

    @property
    def skipped(self) -> int:
        """Bad rows this reader left out of the windows it has read (skipped_rows in metrics)."""
        return self.skipped_before + self.window_skipped

    def peek(self) -> dict:
        while self.offset >= len(self.samples):
            self._read_window()
        return self.samples[self.offset]

    def take(self) -> dict:
        sample = self.peek()
        self.offset += 1
        return sample

    def state_dict(self) -> dict[str, Any]:
        position = {"epoch": self.epoch, "window": self.window, "start": self.window_start, "offset": self.offset}
        return {**position, "skipped_before": self.skipped_before, "window_skipped": self.window_skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped_before = int(state.get("skipped_before", 0))  # the saved window is read (and counted) again
        self.window_skipped = 0
        self.epoch = int(state["epoch"])
        self.window, self.window_start, self.offset = -1, None, 0
        self.samples, self._windows = [], None
        self._resume = state if int(state["window"]) >= 0 else None

    # ---- reading --------------------------------------------------------------------------------

    def _open_pass(self) -> None:
        from datasets.distributed import split_dataset_by_node

        if self._rows is None:
            self._rows = split_dataset_by_node(
                open_rows(self.source, self.data.cache_dir), rank=self.reader, world_size=self.readers
            )
        self._rows.set_epoch(self.epoch)  # reorders the files for this pass (a seeded draw of `datasets`)
        start = self._resume["start"] if self._resume else None
        if start is not None:
            self._rows.load_state_dict(start)
        self._next_start = start
        self._pass_from_start = self._resume is None
        self._pass_samples = 0
        # iter(batch_size) reads windows directly; plain iteration inside a dataloader worker would
        # split the shards among workers a second time.
        self._windows = iter(self._rows.iter(batch_size=self.data.window))

    def _read_window(self) -> None:
        if self._windows is None:
            self._open_pass()
        start = self._next_start
        try:
            rows = next(self._windows)
        except RecipeError:
            raise
        except StopIteration:
            if self._pass_from_start and self._pass_samples == 0:
                raise RecipeError.single(
                    f"source {self.source.label!r} gave reader {self.reader} of {self.readers} no sample in a whole "
                    "pass (each rank and each dataloader worker reads its own share of the rows)",
                    key=self.source.key,
                    fix="give the source more rows than world size x max(1, data.num_workers), or fewer workers",
                ) from None
            self.epoch += 1
            self.window, self._windows, self._resume = -1, None, None
            self.samples, self.offset = [], 0
            return
        except Exception as error:  # noqa: BLE001 - the reader's parse error is the user's data
            raise self._unreadable(error) from None
        self._next_start = self._rows.state_dict()  # the state after this window: the next one's start
        self.window, self.offset = self.window + 1, 0
        if self._resume is not None:  # the saved window, re-read: continue after its taken samples
            self.window, self.offset = int(self._resume["window"]), int(self._resume["offset"])
            self._resume = None
        self.window_start = start
        self.skipped_before += self.window_skipped
        self.window_skipped = sum(rows.pop(SKIPPED_BEFORE, None) or ())  # lines the JSON reader left out
        samples = self._tokenize(rows)
        if self.epoch > 0:  # a later pass reads the same rows again: each bad row counts once
            self.window_skipped = 0
        self._pass_samples += len(samples)
        order = np.random.default_rng([self.seed, self.source.index, self.reader, self.epoch, self.window])
        self.samples = [samples[i] for i in order.permutation(len(samples))]

    def _unreadable(self, error: Exception) -> RecipeError:
        """A row the streaming reader cannot parse (malformed JSON, bad encoding, a column changing
        type). Streams are not scanned ahead (that would read the corpus first), so it surfaces here."""
        data = self.source.data
        what = data.path if data.source == "file" else f"hub dataset {data.name}"
        named = "" if self.source.key == "data" else f"source {self.source.label!r}, "
        return RecipeError.single(
            f"cannot read {named}{what} while streaming (window {self.window + 2} of reader {self.reader}): "
            f"{type(error).__name__}: {condensed(error)}",
            key=self.source.key if self.source.key != "data" else "data.path",
            fix="fix or remove that row; to have every bad row named by file and line, run `ditty run` once "
            "with data.streaming = false (the files are then checked up front)",
        )

    def _tokenize(self, rows: dict[str, list]) -> list[dict]:
        columns = self.format.columns_found(self.source.data, list(rows))
        missing = [(key, column) for key, column in columns.items() if column not in rows]
        if missing:
            key, column = missing[0]
            raise RecipeError.single(
                f"column {column!r} is missing from source {self.source.label!r} "
                f"(columns found: {', '.join(rows) or 'none'})",
                key=key.replace("data.", f"{self.source.key}.", 1) if self.source.key != "data" else key,
                fix="name one of the columns found, or pick the format that matches the data",
            )
        rows = self._checked(rows)
        encoded = self.encode(rows)
        problems = encoded.pop(CUT_PROBLEM, None)
        names = list(encoded)
        samples = [dict(zip(names, values)) for values in zip(*(encoded[name] for name in names))]
        if problems and any(problems):  # the cut to max_seq_len left these unusable: bad rows
            from ditty.data.formats import check_cut_problems

            where = f"source {self.source.label!r} (window {self.window + 2} of reader {self.reader})"
            check_cut_problems([p for p in problems if p], self.source.data, where, rows=len(problems))
            samples = [sample for sample, problem in zip(samples, problems) if not problem]
            self.window_skipped += sum(1 for problem in problems if problem)
        return samples

    def _checked(self, rows: dict[str, list]) -> dict[str, list]:
        """The window's rows that the format can use. A stream is not scanned ahead, so a bad row
        surfaces here: an error naming it, or (data.on_bad_rows = "skip") left out."""
        from ditty.data.rows import row_problem

        names = list(rows)
        kept = []
        for values in zip(*(rows[name] for name in names)):
            row = dict(zip(names, values))
            problem = row_problem(row, self.check)
            if problem is None:
                kept.append(values)
            elif self.data.on_bad_rows == "skip":
                self.window_skipped += 1
            else:
                raise RecipeError.single(
                    f"a bad row in source {self.source.label!r} (window {self.window + 2} of reader {self.reader}): "
                    f"{problem}",
                    key=self.source.key if self.source.key != "data" else "data.path",
                    fix='fix or remove that row, or set data.on_bad_rows = "skip" to train without such rows',
                )
        return {name: [values[i] for values in kept] for i, name in enumerate(names)}


class ReaderStream:
    """One reader's micro-batches: its sources mixed by tokens, rows packed or padded (module doc)."""

    def __init__(
        self,
        data: StreamingData,
        *,
        reader: int,
        readers: int,
        seed: int,
        micro_batch_size: int,
        packing: bool,
        max_seq_len: int,
        collator: Any,
    ) -> None:
        self.sources = [SourceReader(s, data, reader=reader, readers=readers, seed=seed) for s in data.sources]
        self.mixer = TokenMixer([s.weight for s in data.sources])
        self.micro_batch_size = micro_batch_size
        self.packing = packing
        self.max_seq_len = max_seq_len
        self.collator = collator
        self.reader = reader
        self.taken = 0
        """Samples this reader has put into batches: with the reader's number, a sample's place in
        its order (masked LM draws its masks from it)."""

    def next_micro_batch(self) -> dict[str, torch.Tensor]:
        rows = [self._row() for _ in range(self.micro_batch_size)]
        if self.packing:
            return self.collator.pack(rows)
        positions = [(self.reader << 40) + self.taken - len(rows) + n for n in range(len(rows))]
        return self.collator([row[0] for row in rows], positions)

    def _row(self) -> list[dict]:
        row = [self._take()]
        if self.packing:
            used = len(row[0]["input_ids"])
            while used + len(self._peek()["input_ids"]) <= self.max_seq_len:
                row.append(self._take())
                used += len(row[-1]["input_ids"])
        return row

    def _peek(self) -> dict:
        return self.sources[self.mixer.pick()].peek()

    def _take(self) -> dict:
        source = self.mixer.pick()
        sample = self.sources[source].take()
        self.mixer.add(source, len(sample["input_ids"]))
        self.taken += 1
        return sample

    def state_dict(self) -> dict[str, Any]:
        return {
            "sources": [s.state_dict() for s in self.sources],
            "mixer": self.mixer.state_dict(),
            "taken": self.taken,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for source, saved in zip(self.sources, state["sources"]):
            source.load_state_dict(saved)
        self.mixer.load_state_dict(state["mixer"])
        self.taken = int(state.get("taken", 0))
