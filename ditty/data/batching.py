"""The batch stream: which samples each rank trains on at each optimizer step.

One seeded permutation of the WHOLE dataset per epoch (from seed and epoch, never from the world
size) fixes the global order; `cursor` counts the samples consumed since the start of training.
Each optimizer step takes the next `global_batch_size` "rows" from that order; rank r trains on the
r-th contiguous slice of them, cut into micro-batches. Two ranks with micro-batch 4 thus see
together exactly the rows one rank with micro-batch 8 sees, and a stream resumed from `cursor` on
any world size continues with the same samples.

A row is one sample, or, with packing, as many consecutive samples of the order as fit in
`max_seq_len` (greedy, in order: a row closes when the next sample does not fit). Packing is
planned on the global order, before the split among ranks, so `global_batch_size` counts packed
rows and a step consumes a variable number of samples; each rank plans all rows from the sample
lengths (cheap) and fetches only the tokens of its own.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import numpy as np
import torch

from ditty.config.errors import RecipeError
from ditty.data.collate import fetch_rows

GROUP_WINDOW_BATCHES = 16
"""group_by_length sorts the order within windows of this many batches: wide enough to cut most
padding, narrow enough that lengths still vary from window to window."""


def group_by_length(order: np.ndarray, lengths: np.ndarray, batch_size: int) -> np.ndarray:
    """`order` sorted by length, longest first, within consecutive windows of GROUP_WINDOW_BATCHES
    batches: batches of similar lengths, whose lengths still vary from window to window. The sort is
    stable, so equal lengths keep the permutation's order and the result is deterministic. The
    longest batch of the first window comes first, so a sequence length that does not fit in
    memory fails at the first step rather than hours in."""
    window = batch_size * GROUP_WINDOW_BATCHES
    chunks = [order[start : start + window] for start in range(0, len(order), window)]
    return np.concatenate([chunk[np.argsort(-lengths[chunk], kind="stable")] for chunk in chunks])


def accumulation_steps_for(global_batch_size: int, micro_batch_size: int, rank: int, world_size: int) -> int:
    """Micro-batches per rank per optimizer step; ValueError when the global batch does not split
    evenly into micro-batches on every rank, or `rank` is not one of `world_size`."""
    per_forward = micro_batch_size * world_size
    # The recipe compiler reports an uneven split to users (rule batch.divisible); this guards
    # direct callers of the stream.
    if micro_batch_size < 1 or global_batch_size % per_forward:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not a multiple of micro_batch_size {micro_batch_size} "
            f"x world_size {world_size}"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world_size {world_size}")
    return global_batch_size // per_forward


def micro_batches_of_rank(step: list, stream: Any) -> list[list]:
    """This rank's contiguous slice of one global step's items, cut into micro-batches. `stream`
    holds `global_batch_size`, `micro_batch_size`, `rank` and `world_size`."""
    per_rank = stream.global_batch_size // stream.world_size
    mine = step[stream.rank * per_rank : (stream.rank + 1) * per_rank]
    size = stream.micro_batch_size
    return [mine[start : start + size] for start in range(0, per_rank, size)]


class Stream(Protocol):
    """What the trainer asks of every stream: this rank's micro-batches of the next step, the
    position (saved with each checkpoint), per-source token counts, and an end to its workers."""

    accumulation_steps: int
    cursor: int

    def next_step(self) -> list[Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def source_tokens(self) -> dict[str, int]:
        """Tokens each source put into training so far (empty for one source)."""
        ...

    def close(self) -> None: ...


class GlobalOrder:
    """The position in the one global sample order that every stream shares (see the module doc):
    a seeded permutation per epoch, the cursor, the batch geometry, and the resume state. Streams
    add how a step's samples become this rank's micro-batches (`next_step`)."""

    def __init__(
        self,
        num_samples: int,
        *,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        cursor: int = 0,
    ) -> None:
        self.accumulation_steps = accumulation_steps_for(global_batch_size, micro_batch_size, rank, world_size)
        if num_samples == 0:
            raise ValueError("cannot stream batches from an empty dataset")
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.cursor = cursor
        self._orders: dict[int, np.ndarray] = {}

    @property
    def epoch(self) -> int:
        """Passes over the data completed before the next sample (0 during the first pass)."""
        return self.cursor // self.num_samples

    def state_dict(self) -> dict[str, int]:
        """The cursor is the whole position; seed and dataset size are kept to catch a mismatched resume."""
        return {"cursor": self.cursor, "seed": self.seed, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed:
            raise RecipeError.single(
                f"the checkpoint's data order was drawn with seed {state['seed']}, this run's data seed is {self.seed}",
                key="data.shuffle_seed",
                fix='resume with the same run.seed / data.shuffle_seed, or start afresh (checkpoint.resume = "never")',
            )
        if state["num_samples"] != self.num_samples:
            raise RecipeError.single(
                f"the checkpoint was trained on {state['num_samples']} samples, the data now has {self.num_samples}",
                key="data",
                fix='resume on the data the checkpoint was trained on, or start afresh (checkpoint.resume = "never")',
            )
        self.cursor = int(state["cursor"])

    def source_tokens(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        """Nothing to stop: batches are made in this process."""

    def _peek(self) -> int:
        epoch, position = divmod(self.cursor, self.num_samples)
        return int(self._order(epoch)[position])

    def _take(self) -> int:
        index = self._peek()
        self.cursor += 1
        return index

    def _order(self, epoch: int) -> np.ndarray:
        """The order of dataset indices for one epoch; a step may span two epochs, so two are kept."""
        if epoch not in self._orders:
            order = self._arrange(np.random.default_rng([self.seed, epoch]).permutation(self.num_samples))
            self._orders = {e: o for e, o in self._orders.items() if e == epoch - 1}
            self._orders[epoch] = order
        return self._orders[epoch]

    def _arrange(self, order: np.ndarray) -> np.ndarray:
        """A stream's change to an epoch's permutation (BatchStream's group_by_length); none here."""
        return order


class BatchStream(GlobalOrder):
    """Deterministic, resumable, world-size independent micro-batches for one rank (see module doc)."""

    def __init__(
        self,
        dataset: Any,
        *,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        collator: Any = None,
        packing: bool = False,
        max_seq_len: Optional[int] = None,
        pad_token_id: Optional[int] = None,
        group_by_length: bool = False,
        cursor: int = 0,
        lengths: "np.ndarray | None" = None,
        measure: bool = True,
    ) -> None:
        super().__init__(
            len(dataset),
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            rank=rank,
            world_size=world_size,
            seed=seed,
            cursor=cursor,
        )
        # `lengths`: token counts already known (a mixture reads them source by source); not
        # `measure`: samples that are not token rows, which neither pack nor group by length.
        lengths = sample_lengths(dataset) if lengths is None and measure else lengths
        if lengths is not None and not lengths.all():
            raise ValueError(f"sample {int(np.argmin(lengths))} has no tokens")
        if collator is None:  # token rows of a causal LM: padded, or packed
            from ditty.data.formats.base import PaddingCollator

            collator = PaddingCollator(pad_token_id=pad_token_id, max_seq_len=max_seq_len)
        self.dataset = dataset
        self.collator = collator
        self.packing = packing
        self.max_seq_len = max_seq_len
        # group_by_length is a padding optimisation; packed rows have no padding to cut.
        self.group_by_length = group_by_length and not packing
        self._lengths = np.minimum(lengths, max_seq_len) if max_seq_len and lengths is not None else lengths

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """The `accumulation_steps` micro-batches this rank processes for the next optimizer step."""
        return [self._collate(rows) for rows in micro_batches_of_rank(self._plan_rows(), self)]

    def _plan_rows(self) -> list[list[tuple[int, int]]]:
        """(dataset index, place in the global order) of the samples of each row of the next global
        step; advances the cursor."""
        rows = []
        for _ in range(self.global_batch_size):
            row = [(self._take(), self.cursor - 1)]
            if self.packing:
                used = int(self._lengths[row[0][0]])
                while used + self._lengths[self._peek()] <= self.max_seq_len:
                    row.append((self._take(), self.cursor - 1))
                    used += int(self._lengths[row[-1][0]])
            rows.append(row)
        return rows

    def _arrange(self, order: np.ndarray) -> np.ndarray:
        """group_by_length: sort the permutation by length within windows of global batches."""
        if not self.group_by_length:
            return order
        return group_by_length(order, self._lengths, self.global_batch_size)

    def _collate(self, rows: list[list[tuple[int, int]]]) -> dict[str, torch.Tensor]:
        samples = iter(self._fetch([index for row in rows for index, _ in row]))
        grouped = [[next(samples) for _ in row] for row in rows]
        if self.packing:
            return self.collator.pack(grouped)
        return self.collator([row[0] for row in grouped], [row[0][1] for row in rows])

    def _fetch(self, indices: list[int]) -> list[dict]:
        return fetch_rows(self.dataset, indices)


def sample_lengths(dataset: Any) -> np.ndarray:
    """Token count of every sample, read column-wise from Arrow for `datasets` datasets (no rows
    are materialised in Python, and an indices mapping from a split or shuffle is respected)."""
    if _is_hf_dataset(dataset):
        import pyarrow.compute as pc

        ids_only = dataset.select_columns(["input_ids"]).with_format("arrow")
        pieces = [pc.list_value_length(table["input_ids"]).to_numpy() for table in ids_only.iter(batch_size=65_536)]
        return np.concatenate(pieces).astype(np.int64)
    return np.array([len(sample["input_ids"]) for sample in dataset], dtype=np.int64)


def _is_hf_dataset(dataset: Any) -> bool:
    from datasets import Dataset

    return isinstance(dataset, Dataset)
