"""BatchStream: the samples of each optimizer step do not depend on the world size, a resumed stream
continues identically, epochs wrap with fresh permutations, and bad batch sizes are refused."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from ditty.config.errors import RecipeError
from ditty.data.batching import BatchStream, sample_lengths

PAD = 0


def _samples(count: int = 37) -> list[dict[str, list[int]]]:
    """Samples of lengths 3..14 whose first token is their index (+1, so never the pad id)."""
    out = []
    for index in range(count):
        ids = [index + 1] + [100 + index % 7] * (2 + (index * 5) % 12)
        out.append({"input_ids": ids, "labels": [-100] + ids[1:]})
    return out


@pytest.fixture(params=["list", "datasets"])
def dataset(request):
    samples = _samples()
    return samples if request.param == "list" else Dataset.from_list(samples)


def _stream(dataset, **overrides) -> BatchStream:
    settings = dict(
        global_batch_size=8,
        micro_batch_size=4,
        rank=0,
        world_size=1,
        seed=3,
        packing=False,
        max_seq_len=24,
        pad_token_id=PAD,
    )
    settings.update(overrides)
    return BatchStream(dataset, **settings)


def _rows(micro_batches) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each row's (tokens, position ids) with the padding stripped, in order."""
    rows = []
    for batch in micro_batches:
        for ids, positions in zip(batch["input_ids"].tolist(), batch["position_ids"].tolist()):
            keep = [i for i, token in enumerate(ids) if token != PAD]
            rows.append((tuple(ids[i] for i in keep), tuple(positions[i] for i in keep)))
    return rows


@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("group_by_length", [False, True])
def test_two_ranks_together_see_exactly_what_one_rank_sees(dataset, packing, group_by_length):
    one = _stream(dataset, micro_batch_size=8, packing=packing, group_by_length=group_by_length)
    ranks = [
        _stream(dataset, rank=r, world_size=2, micro_batch_size=2, packing=packing, group_by_length=group_by_length)
        for r in range(2)
    ]
    for _ in range(12):  # several epochs' worth
        alone = one.next_step()
        together = [rank.next_step() for rank in ranks]
        assert [len(steps) for steps in together] == [2, 2]  # accumulation = 8 / (2 x 2)
        assert _rows(alone) == _rows(together[0]) + _rows(together[1])
        assert one.cursor == ranks[0].cursor == ranks[1].cursor
    assert one.epoch >= 2


def test_micro_batches_pad_right_to_their_longest_sample(dataset):
    batch = _stream(dataset).next_step()[0]
    lengths = batch["attention_mask"].sum(dim=1)
    assert batch["input_ids"].shape[1] == lengths.max()
    for row, length in enumerate(lengths.tolist()):
        assert batch["input_ids"][row, length:].eq(PAD).all()
        assert batch["labels"][row, length:].eq(-100).all()
        assert batch["labels"][row, 0] == -100
    assert batch["attention_mask"].dtype == batch["position_ids"].dtype == torch.long


def test_each_epoch_is_a_new_permutation_of_all_samples(dataset):
    stream = _stream(dataset, global_batch_size=37, micro_batch_size=37)
    epochs = [[ids[0] - 1 for ids, _ in _rows(stream.next_step())] for _ in range(3)]
    for order in epochs:
        assert sorted(order) == list(range(37))
    assert epochs[0] != epochs[1] != epochs[2]
    assert stream.epoch == 3


@pytest.mark.parametrize("packing", [False, True])
def test_a_resumed_stream_yields_identical_batches(dataset, packing):
    original = _stream(dataset, packing=packing)
    for _ in range(5):
        original.next_step()
    state = original.state_dict()

    resumed = _stream(dataset, packing=packing)
    resumed.load_state_dict(state)
    for _ in range(6):
        for expected, got in zip(original.next_step(), resumed.next_step(), strict=True):
            assert expected.keys() == got.keys()
            for key in expected:  # packed batches also hold ints (max_length_q/k)
                same = (
                    torch.equal(expected[key], got[key])
                    if torch.is_tensor(expected[key])
                    else expected[key] == got[key]
                )
                assert same, key


def test_a_mismatched_resume_is_a_recipe_error(dataset):
    state = _stream(dataset).state_dict()
    with pytest.raises(RecipeError, match="data.shuffle_seed"):
        _stream(dataset, seed=4).load_state_dict(state)
    with pytest.raises(RecipeError, match="trained on 37 samples, the data now has 36"):
        _stream(_samples(36)).load_state_dict(state)


def test_a_stream_resumed_on_another_world_size_continues_with_the_same_samples(dataset):
    one = _stream(dataset, micro_batch_size=8)
    for _ in range(3):
        one.next_step()
    ranks = [_stream(dataset, rank=r, world_size=2, cursor=one.cursor) for r in range(2)]
    assert _rows(one.next_step()) == _rows(ranks[0].next_step()) + _rows(ranks[1].next_step())


def test_accumulation_must_divide(dataset):
    with pytest.raises(ValueError, match="not a multiple"):
        _stream(dataset, global_batch_size=10, micro_batch_size=4)
    with pytest.raises(ValueError, match="not a multiple"):
        _stream(dataset, global_batch_size=8, micro_batch_size=4, world_size=3, rank=0)


def test_packed_rows_fill_up_to_max_seq_len_in_order(dataset):
    stream = _stream(dataset, packing=True, max_seq_len=24)
    rows = _rows(stream.next_step())
    consumed = stream.cursor
    assert consumed > 8  # several samples per row
    for tokens, positions in rows:
        assert len(tokens) <= 24
        # Position ids restart at 0 for each packed sample.
        starts = [i for i, position in enumerate(positions) if position == 0]
        assert len(starts) >= 1 and starts[0] == 0


def test_group_by_length_cuts_padding(dataset):
    def padding(stream):
        total = 0
        for _ in range(5):
            for batch in stream.next_step():
                total += int((batch["attention_mask"] == 0).sum())
        return total

    assert padding(_stream(dataset, group_by_length=True)) < padding(_stream(dataset))


@settings(max_examples=25, deadline=None)
@given(
    world_size=st.sampled_from([1, 2, 4]),
    micro_batch_size=st.integers(1, 3),
    accumulation=st.integers(1, 3),
    packing=st.booleans(),
    seed=st.integers(0, 2**31),
    cursor=st.integers(0, 100),
)
def test_any_split_of_a_global_step_covers_the_same_rows(
    world_size, micro_batch_size, accumulation, packing, seed, cursor
):
    samples = _samples(23)
    global_batch_size = world_size * micro_batch_size * accumulation
    common = dict(global_batch_size=global_batch_size, seed=seed, packing=packing, cursor=cursor)
    alone = _stream(samples, micro_batch_size=global_batch_size, **common)
    ranks = [
        _stream(samples, rank=r, world_size=world_size, micro_batch_size=micro_batch_size, **common)
        for r in range(world_size)
    ]
    for _ in range(3):
        split = [rank.next_step() for rank in ranks]
        assert all(len(steps) == accumulation for steps in split)
        assert _rows(alone.next_step()) == [row for steps in split for row in _rows(steps)]


def test_lengths_follow_a_split_dataset():
    """A train/validation split is an index mapping over the Arrow table; lengths must follow it."""
    split = Dataset.from_list(_samples()).train_test_split(test_size=5, seed=0)["train"]
    assert sample_lengths(split).tolist() == [len(ids) for ids in split["input_ids"]]
