"""The bundled post-training recipes give the metrics they gave before the objective table built them:
three steps of tiny_grpo (two settings: group advantages alone; the KL reference, two updates per
rollout and sequence-level ratios), tiny_dpo and tiny_reward from one tiny start, to 1e-6 of the values
recorded in pins.json (by `python -m tests.objectives.pinned_runs DIR` on the code before the change).
Evaluating before the first step, which came later, changes none of them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.objectives.pinned_runs import RUNS, run

pytestmark = pytest.mark.slow  # four short runs: ~20 s of CPU

PINS = json.loads((Path(__file__).parent / "pins.json").read_text())


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_bundled_recipe_logs_what_it_logged_before(tmp_path, tiny_llama_dir, name):
    # the step-0 evaluation (train.eval_at_start) came after the pins: the steps themselves are pinned
    records = [r for r in run(name, tiny_llama_dir, tmp_path) if r["step"] > 0]
    pinned = PINS[name]
    assert [r["step"] for r in records] == [r["step"] for r in pinned]
    for got, want in zip(records, pinned):
        assert sorted(got) == sorted(want), (got["step"], sorted(set(got) ^ set(want)))
        for key, value in want.items():
            if isinstance(value, float) and math.isfinite(value):
                assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (name, got["step"], key)
            else:
                assert got[key] == value, (name, got["step"], key)
