import json
import logging
import random

import numpy as np
import torch

from ditty.checkpoint import rng


def _draws():
    return (
        random.random(),
        random.gauss(0, 1),
        np.random.rand(3).tolist(),
        np.random.randn(),
        torch.rand(4).tolist(),
        torch.randn(2).tolist(),
    )


def test_round_trip_is_exact_through_json():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    np.random.randn()  # and in numpy's
    state = json.loads(json.dumps(rng.capture()))  # what the sidecar stores
    expected = _draws()
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    assert _draws() != expected
    rng.restore(state)
    assert _draws() == expected


def test_restore_for_rank_picks_the_rank_and_warns_when_missing(caplog):
    torch.manual_seed(5)
    states = {"0": rng.capture()}
    expected = torch.rand(3)
    torch.manual_seed(6)
    assert rng.restore_for_rank(states, 0)
    assert torch.equal(torch.rand(3), expected)
    with caplog.at_level(logging.WARNING):
        assert not rng.restore_for_rank(states, 1)
    assert "rank 1" in caplog.text
