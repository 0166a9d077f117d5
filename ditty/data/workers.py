"""Data streams behind dataloader workers (`data.num_workers`), with an exact, saved position.

A worker runs ahead of training by `prefetch_factor` batches, so its own position is never the
position of what training consumed. Each batch therefore travels with the position right after it
(a few integers, plus a `datasets` state for a streaming source), and a stream's state is the
position attached to the last batch the trainer took. torchdata's `StatefulDataLoader` does the
same in general (workers snapshot their state every n batches); here the state is small enough to
send with every batch, so a plain `torch.utils.data.DataLoader` does.

- `StreamingBatches` (data.streaming): each worker runs one reader of ditty/data/streaming.py. The
  DataLoader takes batches from workers in turn, so the next batch comes from reader
  `next_reader`; after a resume, worker i runs reader (next_reader + i) mod workers, and the turns
  go on where they stopped. State: every reader's position, per rank, gathered to one dictionary
  (a collective: `state_dict` runs on every rank, as the checkpoint sidecar is built on all).
- `PrefetchedStream` (token data read up front): the main process plans each step (cheap: sample
  lengths only), workers fetch and collate its micro-batches (packing builds [B, 1, T, T] masks).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import torch

from ditty.config.errors import RecipeError
from ditty.data.batching import accumulation_steps_for, micro_batches_of_rank
from ditty.data.streaming import ReaderStream, StreamingData


def _keep(item: Any) -> Any:
    """collate_fn of the loaders: items are already micro-batches (module level: workers pickle it)."""
    return item


def _start_method() -> Optional[str]:
    """ "fork" on Linux, else the platform's default. A worker exits when its parent process dies
    (torch's worker watchdog compares `os.getppid()` with its parent at start). Forked, that parent
    is the trainer, so workers of a killed run go with it; started by a forkserver (the default of
    a process that was itself started by one, and of Python 3.14), the parent is the forkserver,
    which outlives the trainer, and the workers would wait forever."""
    import multiprocessing
    import sys

    return "fork" if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods() else None


def _loader(dataset: Any, workers: int, prefetch_factor: int, sampler: Any = None) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        sampler=sampler,
        num_workers=workers,
        prefetch_factor=prefetch_factor,
        collate_fn=_keep,
        in_order=True,  # batches come back in the order they were asked for: the state follows them
        # The workers' base seed comes from here, not from torch's global generator: starting workers
        # must not shift the dropout stream a resumed run restores (nothing here draws from it).
        generator=torch.Generator().manual_seed(0),
        multiprocessing_context=_start_method(),
    )


def _gather(value: Any, world_size: int) -> list:
    """Every rank's `value`, in rank order (one all_gather_object when there are several ranks)."""
    if world_size == 1:
        return [value]
    import torch.distributed as dist

    out: list = [None] * world_size
    dist.all_gather_object(out, value)
    return out


def streamed_skipped_rows(stream: Any) -> int:
    """Bad rows a streaming run's readers left out so far (0 for data read up front, whose bad rows
    are counted before training). Collective for a streaming run: call it on every rank at once."""
    count = getattr(stream, "skipped_rows", None)
    return int(count()) if callable(count) else 0


# ---------------------------------------------------------------------------------------- streaming


def make_reader(data: StreamingData, reader: int, readers: int, **batching: Any) -> ReaderStream:
    return ReaderStream(data, reader=reader, readers=readers, **batching)


class _ReaderPool(torch.utils.data.IterableDataset):
    """Inside worker i: reader (first + i) mod workers of this rank, from its saved position."""

    def __init__(self, build: Callable[[int], ReaderStream], states: list, first: int) -> None:
        self.build, self.states, self.first = build, states, first

    def __iter__(self) -> Iterator[tuple]:
        info = torch.utils.data.get_worker_info()
        local = (self.first + info.id) % info.num_workers
        try:
            reader = self.build(local)
            if self.states[local] is not None:
                reader.load_state_dict(self.states[local])
            while True:
                batch = reader.next_micro_batch()
                yield local, batch, reader.state_dict()
        except RecipeError as error:  # re-raised as itself in the trainer (the DataLoader would wrap it)
            yield local, error, None


class StreamingBatches:
    """The trainer's stream for `data.streaming` (see the module doc); `next_step()` gives this rank's
    micro-batches of the next optimizer step."""

    def __init__(
        self,
        data: StreamingData,
        *,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        packing: bool,
        max_seq_len: int,
        pad_token_id: Optional[int] = None,
        collator: Any = None,
        num_workers: int = 0,
        prefetch_factor: int = 2,
    ) -> None:
        if collator is None:  # token rows of a causal LM: padded, or packed
            from ditty.data.formats.base import PaddingCollator

            collator = PaddingCollator(pad_token_id=pad_token_id, max_seq_len=max_seq_len)
        self.accumulation_steps = accumulation_steps_for(global_batch_size, micro_batch_size, rank, world_size)
        self.data = data
        self.global_batch_size = global_batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.local_readers = max(1, num_workers)
        self.batching = dict(
            seed=seed, micro_batch_size=micro_batch_size, packing=packing, max_seq_len=max_seq_len,
            collator=collator,
        )  # fmt: skip
        self.states: list[Optional[dict]] = [None] * self.local_readers
        self.next_reader = 0
        self.cursor = 0
        """Rows consumed by all ranks together (steps x global batch)."""
        self._inline: Optional[ReaderStream] = None
        self._batches: Optional[Iterator] = None

    def build_reader(self, local: int) -> ReaderStream:
        readers = self.world_size * self.local_readers
        return make_reader(self.data, self.rank * self.local_readers + local, readers, **self.batching)

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        step = [self._next_micro_batch() for _ in range(self.accumulation_steps)]
        self.cursor += self.global_batch_size
        return step

    def _next_micro_batch(self) -> dict[str, torch.Tensor]:
        if self.workers == 0:
            if self._inline is None:
                self._inline = self.build_reader(0)
                if self.states[0] is not None:
                    self._inline.load_state_dict(self.states[0])
            batch = self._inline.next_micro_batch()
            self.states[0] = self._inline.state_dict()
            return batch
        if self._batches is None:
            pool = _ReaderPool(self.build_reader, list(self.states), self.next_reader)
            self._batches = iter(_loader(pool, self.workers, self.prefetch_factor))
        local, batch, state = next(self._batches)
        if isinstance(batch, RecipeError):
            raise batch
        self.states[local] = state
        self.next_reader = (local + 1) % self.workers
        return batch

    # ---- position --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every rank's reader positions (collective with several ranks)."""
        mine = {"readers": list(self.states), "next_reader": self.next_reader}
        return {
            "streaming": True,
            "world_size": self.world_size,
            "num_workers": self.workers,
            "seed": self.seed,
            "cursor": self.cursor,
            "ranks": _gather(mine, self.world_size),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state.get("streaming"):
            raise RecipeError.single(
                "the checkpoint's data position is a global sample cursor (data read up front), this run streams",
                key="data.streaming",
                fix="resume with the checkpoint's data.streaming setting, or start afresh "
                '(checkpoint.resume = "never")',
            )
        saved = (int(state["world_size"]), int(state["num_workers"]))
        if saved != (self.world_size, self.workers):
            raise RecipeError.single(
                f"the checkpoint streamed its data on {saved[0]} rank(s) x {max(1, saved[1])} reader(s) each, this "
                f"run has {self.world_size} x {self.local_readers}: each reader holds its own share of the rows and "
                "its own position, and another split of the rows cannot continue exactly where those stopped",
                key="data.streaming",
                fix=f"resume with --nproc-per-node {saved[0]} and data.num_workers = {saved[1]}, or start afresh "
                '(checkpoint.resume = "never")',
            )
        if int(state["seed"]) != self.seed:
            raise RecipeError.single(
                f"the checkpoint's data order was drawn with seed {state['seed']}, this run's data seed is {self.seed}",
                key="data.shuffle_seed",
                fix='resume with the same run.seed / data.shuffle_seed, or start afresh (checkpoint.resume = "never")',
            )
        mine = state["ranks"][self.rank]
        self.close()
        self.states = list(mine["readers"])
        self.next_reader = int(mine["next_reader"])
        self.cursor = int(state["cursor"])

    def source_tokens(self) -> dict[str, int]:
        """Tokens each source put into training, all ranks together (collective with several ranks)."""
        if not self.data.report_sources:
            return {}
        mine = [0] * len(self.data.sources)
        for state in self.states:
            for index, tokens in enumerate(state["mixer"]["tokens"] if state else []):
                mine[index] += int(tokens)
        totals = [sum(column) for column in zip(*_gather(mine, self.world_size))]
        return {source.label: total for source, total in zip(self.data.sources, totals)}

    def skipped_rows(self) -> int:
        """Bad rows the readers left out (data.on_bad_rows = "skip"), all ranks together, as of the
        last batch taken (collective with several ranks)."""
        mine = sum(
            int(source.get("skipped_before", 0)) + int(source.get("window_skipped", 0))
            for state in self.states
            if state
            for source in state["sources"]
        )
        return sum(_gather(mine, self.world_size))

    def close(self) -> None:
        """Stop the workers (dropping the DataLoader iterator shuts them down)."""
        self._batches = None
        self._inline = None


# ------------------------------------------------------------------------------ token data, prefetched


class _StepPlans(torch.utils.data.Sampler):
    """Main process: the rows of each next step of this rank, with the stream's state after it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[tuple]:
        while True:
            step = micro_batches_of_rank(self.stream._plan_rows(), self.stream)
            yield step, self.stream.state_dict()


class _Collator(torch.utils.data.Dataset):
    """Worker: one planned step's micro-batches (reads the tokens of its rows and collates them)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __getitem__(self, planned: tuple) -> tuple:
        step, state = planned
        return [self.stream._collate(rows) for rows in step], state


class PrefetchedStream:
    """A `BatchStream` (or `MixtureStream`) whose micro-batches workers collate ahead of training."""

    def __init__(self, stream: Any, *, num_workers: int, prefetch_factor: int = 2) -> None:
        self.stream = stream
        self.workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.accumulation_steps = stream.accumulation_steps
        self._state = stream.state_dict()
        self._steps: Optional[Iterator] = None

    @property
    def cursor(self) -> int:
        return int(self._state["cursor"])

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        if self._steps is None:
            loader = _loader(_Collator(self.stream), self.workers, self.prefetch_factor, _StepPlans(self.stream))
            self._steps = iter(loader)
        batches, self._state = next(self._steps)
        return batches

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._steps = None  # the planner restarts from the loaded position
        self.stream.load_state_dict(state)
        self._state = self.stream.state_dict()

    def source_tokens(self) -> dict[str, int]:
        """From the state after the last step handed out (the planner itself runs steps ahead)."""
        if "mixer" not in self._state:
            return {}
        return dict(zip(self.stream.mixture.labels, self._state["mixer"]["tokens"]))

    def close(self) -> None:
        self._steps = None  # dropping the DataLoader iterator shuts its workers down
