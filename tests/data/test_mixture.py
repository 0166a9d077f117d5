"""[[data.sources]] read up front: the token-share mixing rule, MixtureStream's world-size
independence and exact resume, resolved source settings, and workers collating ahead (PrefetchedStream)."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset

from ditty.config.errors import RecipeError
from ditty.config.sections import DataConfig, DataSourceConfig
from ditty.data.mixture import MixtureData, MixtureStream, TokenMixer, resolve_sources
from ditty.data.workers import PrefetchedStream

PAD = 0


def _source(tag: int, count: int, base: int) -> Dataset:
    """Samples whose first token names the source (tag) and whose second names the sample."""
    rows = []
    for index in range(count):
        ids = [tag, base + index] + [7] * ((index * 5) % 9)
        rows.append({"input_ids": ids, "labels": [-100] + ids[1:]})
    return Dataset.from_list(rows)


@pytest.fixture
def mixture() -> MixtureData:
    return MixtureData([_source(1, 23, 100), _source(2, 11, 300)], ["web", "code"], [0.7, 0.3])


def _stream(mixture, **overrides) -> MixtureStream:
    settings = dict(
        global_batch_size=8, micro_batch_size=4, rank=0, world_size=1, seed=5, packing=False, max_seq_len=16,
        pad_token_id=PAD,
    )  # fmt: skip
    settings.update(overrides)
    return MixtureStream(mixture, **settings)


def _rows(micro_batches) -> list[tuple[int, ...]]:
    return [tuple(t for t in row if t != PAD) for batch in micro_batches for row in batch["input_ids"].tolist()]


def test_token_mixer_keeps_every_source_within_one_sample_of_its_share():
    mixer = TokenMixer([0.5, 0.3, 0.2])
    lengths = [[5, 17, 9], [40, 3], [11]]
    longest = max(max(group) for group in lengths)
    picks = []
    for draw in range(3000):
        source = mixer.pick()
        picks.append(source)
        mixer.add(source, lengths[source][draw % len(lengths[source])])
        total = sum(mixer.tokens)
        for index, weight in enumerate(mixer.weights):
            assert abs(mixer.tokens[index] - weight * total) <= longest
    assert picks[0] == 0  # all equal at the start: the largest weight goes first
    again = TokenMixer([0.5, 0.3, 0.2])
    again.load_state_dict(json.loads(json.dumps(mixer.state_dict())))
    assert again.pick() == mixer.pick()


@pytest.mark.parametrize("packing", [False, True])
def test_mixture_does_not_depend_on_the_world_size(mixture, packing):
    one = _stream(mixture, packing=packing)
    ranks = [_stream(mixture, packing=packing, rank=r, world_size=2, micro_batch_size=2) for r in range(2)]
    for _ in range(9):  # past the end of both sources: each wraps into a new permutation of its own
        together = [row for stream in ranks for row in _rows(stream.next_step())]
        assert together == _rows(one.next_step())
    assert [stream.source_tokens() for stream in ranks] == [one.source_tokens()] * 2


def test_mixture_resumes_exactly_and_reaches_its_token_shares(mixture):
    stream = _stream(mixture, packing=True)
    states, steps = [], []
    for _ in range(24):
        states.append(json.loads(json.dumps(stream.state_dict())))  # the sidecar is JSON
        steps.append(_rows(stream.next_step()))
    for start in (0, 7, 19):
        resumed = _stream(mixture, packing=True)
        resumed.load_state_dict(states[start])
        assert [_rows(resumed.next_step()) for _ in range(5)] == steps[start : start + 5]
    tokens = stream.source_tokens()
    assert abs(tokens["web"] / (tokens["web"] + tokens["code"]) - 0.7) < 0.02
    # The counts are the tokens that entered the model.
    fresh = _stream(mixture, packing=True)
    entered = sum(int((b["input_ids"] != PAD).sum()) for _ in range(24) for b in fresh.next_step())
    assert sum(tokens.values()) == entered


def test_a_mixture_checkpoint_refuses_other_sources(mixture):
    state = _stream(mixture).state_dict()
    other = MixtureData([_source(1, 22, 100), _source(2, 11, 300)], ["web", "code"], [0.7, 0.3])
    with pytest.raises(RecipeError, match="held \\[23, 11\\] samples"):
        _stream(other).load_state_dict(state)
    single = {"cursor": 3, "seed": 5, "num_samples": 34}
    with pytest.raises(RecipeError, match="single data source"):
        _stream(mixture).load_state_dict(single)


def test_sources_inherit_the_data_settings_they_leave_unset():
    data = DataConfig(
        format="text",
        text_column="body",
        val_fraction=0.1,
        sources=[
            DataSourceConfig(path="a.jsonl", weight=3, name="web"),
            DataSourceConfig(source="hub", dataset="org/set", weight=1, format="prompt_completion", val_fraction=0.0),
        ],
    )
    web, hub = resolve_sources(data)
    assert (web.label, web.weight, web.data.format, web.data.text_column, web.data.val_fraction) == (
        "web", 0.75, "text", "body", 0.1
    )  # fmt: skip
    assert (hub.label, hub.weight, hub.data.source, hub.data.name, hub.data.format, hub.key) == (
        "1", 0.25, "hub", "org/set", "prompt_completion", "data.sources.1"
    )  # fmt: skip
    assert hub.data.val_fraction == 0.0 and not hub.data.sources
    [single] = resolve_sources(DataConfig(source="file", path="x.jsonl"))
    assert (single.label, single.key, single.weight) == ("data", "data", 1.0)


@pytest.mark.parametrize("packing", [False, True])
def test_workers_collate_the_same_batches_and_resume_from_what_was_consumed(mixture, packing):
    plain = _stream(mixture, packing=packing)
    expected = [plain.next_step() for _ in range(12)]
    prefetched = PrefetchedStream(_stream(mixture, packing=packing), num_workers=2, prefetch_factor=2)
    before = torch.random.get_rng_state()
    got = [prefetched.next_step() for _ in range(6)]
    assert torch.equal(torch.random.get_rng_state(), before)  # starting workers draws nothing from torch's RNG
    state = json.loads(json.dumps(prefetched.state_dict()))
    if not packing:
        assert state["cursor"] == 6 * 8  # samples of the six steps consumed, not of those prefetched
    assert prefetched.source_tokens() == dict(zip(["web", "code"], state["mixer"]["tokens"]))
    resumed = PrefetchedStream(_stream(mixture, packing=packing), num_workers=1)
    resumed.load_state_dict(state)
    got += [resumed.next_step() for _ in range(6)]
    for mine, theirs in zip(got, expected):
        for a, b in zip(mine, theirs):
            assert a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


def _same(a, b) -> bool:
    """Equal batch values: tensors element by element; packed rows' max lengths are ints."""
    return torch.equal(a, b) if torch.is_tensor(a) else a == b
