"""Per-rank stream state in the checkpoint (ditty.objectives.sampling.stream_state): each rank resumes from its
own entry; another world size only when no rank held anything, else a RecipeError naming how to resume."""

from __future__ import annotations

import pytest

from ditty.config.errors import RecipeError
from ditty.objectives.sampling.stream_state import (
    decode_for_rank,
    encode_by_rank,
    encode_state,
    ranks_holding_samples,
    resumes_on,
)


def pending(*pairs):
    return encode_state({"pairs": list(pairs), "metrics": {}})


def test_each_rank_resumes_from_its_own_entry():
    saved = [pending(rank) for rank in range(3)]
    assert [decode_for_rank(saved, "pending", rank, 3)["pairs"] for rank in range(3)] == [[0], [1], [2]]
    assert resumes_on(saved, 3) and not resumes_on(saved, 2)


def test_one_process_gathers_its_own_entry():
    assert encode_by_rank({"pairs": [1]}, 1) == [encode_state({"pairs": [1]})]


def test_another_world_size_resumes_when_no_rank_held_anything():
    saved = [pending(), pending()]
    assert decode_for_rank(saved, "pending", 0, 1)["pairs"] == []
    assert decode_for_rank(saved, "pending", 3, 4)["pairs"] == []
    assert ranks_holding_samples({"pending": saved}) is None


def test_another_world_size_is_refused_while_a_rank_holds_samples():
    saved = [pending(), pending(7)]
    with pytest.raises(RecipeError) as raised:
        decode_for_rank(saved, "pending", 0, 1)
    problem = raised.value.problems[0]
    assert problem.key == "checkpoint.resume" and "2 ranks" in problem.message and "1 processes" in problem.message
    assert "resume on 2 processes" in problem.fix
    assert ranks_holding_samples({"pending": saved}) == (saved, "preference pairs")


def test_rollouts_reused_over_steps_are_refused_without_decoding_them():
    with pytest.raises(RecipeError, match="rollouts"):
        decode_for_rank(["not a state", "not a state"], "buffer", 0, 4)
    assert ranks_holding_samples({"buffer": ["not a state"]}) == (["not a state"], "rollouts")
    assert ranks_holding_samples({"buffer": None, "ahead": [encode_state([])]}) is None


def test_a_single_entry_is_one_processs_and_refused_on_several_unless_empty():
    one = pending(5)
    assert decode_for_rank(one, "pending", 0, 1)["pairs"] == [5]
    with pytest.raises(RecipeError) as raised:
        decode_for_rank(one, "pending", 1, 2)
    assert "one rank's preference pairs" in raised.value.problems[0].message
    assert decode_for_rank(pending(), "pending", 1, 2)["pairs"] == []
