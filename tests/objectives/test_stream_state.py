"""Per-rank stream state in the checkpoint (ditty.objectives.stream_state): each rank resumes from its
own entry; another world size only when no rank held anything, else a RecipeError naming how to resume."""

from __future__ import annotations

import pytest

from ditty.config.errors import RecipeError
from ditty.objectives.stream_state import decode_for_rank, encode_by_rank, encode_state


def no_pairs(saved):
    return not saved["pairs"]


def test_each_rank_resumes_from_its_own_entry():
    saved = [encode_state({"pairs": [rank]}) for rank in range(3)]
    assert [decode_for_rank(saved, rank, 3, empty=no_pairs, what="pairs")["pairs"] for rank in range(3)] == [
        [0],
        [1],
        [2],
    ]


def test_one_process_gathers_its_own_entry():
    assert encode_by_rank({"pairs": [1]}, 1) == [encode_state({"pairs": [1]})]


def test_another_world_size_resumes_when_no_rank_held_anything():
    saved = [encode_state({"pairs": []}) for _ in range(2)]
    assert decode_for_rank(saved, 0, 1, empty=no_pairs, what="pairs") == {"pairs": []}
    assert decode_for_rank(saved, 3, 4, empty=no_pairs, what="pairs") == {"pairs": []}


def test_another_world_size_is_refused_while_a_rank_holds_samples():
    saved = [encode_state({"pairs": []}), encode_state({"pairs": [7]})]
    with pytest.raises(RecipeError) as raised:
        decode_for_rank(saved, 0, 1, empty=no_pairs, what="preference pairs")
    problem = raised.value.problems[0]
    assert problem.key == "checkpoint.resume" and "2 ranks" in problem.message and "1 processes" in problem.message
    assert "resume on 2 processes" in problem.fix


def test_entries_that_are_never_empty_are_refused_without_decoding_them():
    with pytest.raises(RecipeError, match="rollouts"):
        decode_for_rank(["not a state", "not a state"], 0, 4, empty=None, what="rollouts")


def test_a_single_entry_is_one_processs_and_refused_on_several_unless_empty():
    one = encode_state({"pairs": [5]})
    assert decode_for_rank(one, 0, 1, empty=no_pairs, what="pairs") == {"pairs": [5]}
    with pytest.raises(RecipeError) as raised:
        decode_for_rank(one, 1, 2, empty=no_pairs, what="pairs")
    assert "one rank's pairs" in raised.value.problems[0].message
    assert decode_for_rank(encode_state({"pairs": []}), 1, 2, empty=no_pairs, what="pairs") == {"pairs": []}
