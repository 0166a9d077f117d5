"""Steps from an iterable dataset of the Python API (no len(), no indexing): a torch IterableDataset,
a datasets.IterableDataset, a generator-backed object, anything that can be iterated again.

Every rank reads the whole stream and keeps its slice of each global batch, so the batches do not
depend on the world size (as the global permutation of map-style data does not, ditty.data.batching).
Rows are shuffled within consecutive windows of `shuffle_buffer_size` rows (1: the stream's own
order), as `data.streaming` shuffles; when the stream ends it is read again, the next epoch, in new
window orders. The position is the number of rows taken: a resume reads the stream again from its
start and drops that many, which is exact for a stream that yields the same rows each time it is
iterated and costs one read of them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from ditty.config.errors import RecipeError
from ditty.data.batching import accumulation_steps_for, micro_batches_of_rank


def is_iterable_only(dataset: Any) -> bool:
    """A dataset that can be iterated but not measured or indexed (a DataLoader is neither here)."""
    if isinstance(dataset, torch.utils.data.DataLoader):
        return False
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return True
    return not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")) and hasattr(dataset, "__iter__")


class IterableStream:
    """This rank's micro-batches of an iterable dataset, step by step (see the module doc)."""

    def __init__(
        self,
        dataset: Any,
        *,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        shuffle_buffer_size: int,
        collate_fn: Optional[Callable[[list], Any]] = None,
    ) -> None:
        self.accumulation_steps = accumulation_steps_for(global_batch_size, micro_batch_size, rank, world_size)
        self.dataset = dataset
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle_buffer_size = max(1, shuffle_buffer_size)
        self.collate_fn = collate_fn or torch.utils.data.default_collate
        self.cursor = 0
        """Rows taken since the first epoch began (the whole position)."""
        self.epoch = 0
        self._rows: Optional[Iterator[Any]] = None
        self._taken_this_epoch = 0

    def next_step(self) -> list[Any]:
        """The `accumulation_steps` collated micro-batches this rank processes for the next step."""
        step = [self._take() for _ in range(self.global_batch_size)]
        return [self.collate_fn(micro) for micro in micro_batches_of_rank(step, self)]

    def state_dict(self) -> dict[str, int]:
        return {"cursor": self.cursor, "seed": self.seed, "shuffle_buffer_size": self.shuffle_buffer_size}

    def source_tokens(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        """Nothing to stop: rows are read in this process."""

    def load_state_dict(self, state: dict[str, int]) -> None:
        saved = (int(state["seed"]), int(state["shuffle_buffer_size"]))
        if saved != (self.seed, self.shuffle_buffer_size):
            raise RecipeError.single(
                f"the checkpoint read this stream with seed {saved[0]} and shuffle buffer {saved[1]}; this run has "
                f"{self.seed} and {self.shuffle_buffer_size}, so the rows already trained on cannot be found again",
                key="data.shuffle_buffer_size",
                fix='resume with the same seed and shuffle_buffer_size, or start afresh (checkpoint.resume = "never")',
            )
        self.cursor, self.epoch, self._rows, self._taken_this_epoch = 0, 0, None, 0
        for _ in range(int(state["cursor"])):
            self._take()

    def _take(self) -> Any:
        while True:
            if self._rows is None:
                self._rows = self._shuffled(self.epoch)
            try:
                row = next(self._rows)
            except StopIteration:
                if self._taken_this_epoch == 0 and self.epoch == 0:
                    raise RecipeError.single(
                        "the training dataset yielded no rows", key="data", fix="give a dataset with samples"
                    ) from None
                if self._taken_this_epoch == 0:
                    raise RecipeError.single(
                        f"the training dataset yielded no rows when read again for epoch {self.epoch + 1}",
                        key="data",
                        fix="a generator can be read only once: pass an object whose __iter__ starts over "
                        "(a torch IterableDataset, a datasets.IterableDataset), or stop within one epoch",
                    ) from None
                self.epoch, self._rows, self._taken_this_epoch = self.epoch + 1, None, 0
                continue
            self.cursor += 1
            self._taken_this_epoch += 1
            return row

    def _shuffled(self, epoch: int) -> Iterator[Any]:
        """The stream's rows, `shuffle_buffer_size` at a time (a window), each window in an order drawn
        from (seed, epoch, window): the windows of `data.streaming` (ditty.data.streaming), without
        its saved reader state, since a Python iterable can only be read again from its start."""
        window: list[Any] = []
        number = 0
        for row in self.dataset:
            window.append(row)
            if len(window) == self.shuffle_buffer_size:
                yield from self._in_order(window, epoch, number)
                window, number = [], number + 1
        yield from self._in_order(window, epoch, number)

    def _in_order(self, window: list[Any], epoch: int, number: int) -> Iterator[Any]:
        order = np.random.default_rng([self.seed, epoch, number]).permutation(len(window))
        return (window[i] for i in order)
