"""IterableStream: the Python API's iterable datasets, read in a seeded shuffle buffer, the same
batches on any world size, epochs that read the stream again, and an exact resume."""

from __future__ import annotations

import pytest
import torch

from ditty.config.errors import RecipeError
from ditty.data.iterable import IterableStream, is_iterable_only


class Rows(torch.utils.data.IterableDataset):
    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        return iter(range(self.count))


def stream(count: int = 10, *, buffer: int = 1, rank: int = 0, world_size: int = 1, seed: int = 0, dataset=None):
    return IterableStream(
        Rows(count) if dataset is None else dataset,
        global_batch_size=4,
        micro_batch_size=2,
        rank=rank,
        world_size=world_size,
        seed=seed,
        shuffle_buffer_size=buffer,
        collate_fn=list,
    )


def flat(steps: list) -> list[int]:
    return [row for micro in steps for row in micro]


def test_a_buffer_of_one_keeps_the_stream_order_and_epochs_read_it_again():
    s = stream(10)
    rows = flat(s.next_step() + s.next_step() + s.next_step())
    assert rows == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert s.epoch == 1 and s.cursor == 12


def test_the_buffer_shuffles_each_epoch_by_the_seed():
    s = stream(12, buffer=12)
    first, second = flat(s.next_step() + s.next_step() + s.next_step()), None
    second = flat(s.next_step() + s.next_step() + s.next_step())
    assert sorted(first) == list(range(12)) and sorted(second) == list(range(12))
    assert first != list(range(12)) and first != second  # shuffled, and differently per epoch
    again = stream(12, buffer=12)
    assert flat(again.next_step() + again.next_step() + again.next_step()) == first
    other = stream(12, buffer=12, seed=1)
    assert flat(other.next_step() + other.next_step() + other.next_step()) != first


def test_the_batches_do_not_depend_on_the_world_size():
    alone = stream(10, buffer=4)
    ranks = [stream(10, buffer=4, rank=r, world_size=2) for r in range(2)]
    for _ in range(4):
        assert flat(alone.next_step()) == flat(ranks[0].next_step()) + flat(ranks[1].next_step())


def test_a_resumed_stream_continues_where_the_saved_one_was():
    s = stream(10, buffer=3)
    for _ in range(4):
        s.next_step()
    state = s.state_dict()
    resumed = stream(10, buffer=3)
    resumed.load_state_dict(state)
    for _ in range(5):
        assert resumed.next_step() == s.next_step()
    with pytest.raises(RecipeError, match="seed 0 and shuffle buffer 3"):
        stream(10, buffer=5).load_state_dict(state)


def test_empty_and_read_once_datasets_are_recipe_errors():
    with pytest.raises(RecipeError, match="yielded no rows"):
        stream(0).next_step()
    once = stream(dataset=iter(range(6)))
    once.next_step()
    with pytest.raises(RecipeError, match="read only once"):
        once.next_step()


def test_which_datasets_are_iterable_only():
    assert is_iterable_only(Rows(3)) and is_iterable_only(iter([1, 2]))
    assert not is_iterable_only([1, 2]) and not is_iterable_only(torch.utils.data.DataLoader([1, 2]))
