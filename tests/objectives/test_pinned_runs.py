"""The bundled post-training recipes give the metrics they gave before the objective table built them:
three steps of tiny_grpo (two settings: group advantages alone; the KL reference, two updates per
rollout and sequence-level ratios), tiny_dpo and tiny_reward from one tiny start, to 2e-6 of the
values recorded in pins.json (by `python -m tests.objectives.pinned_runs DIR` on the code before the
change). Evaluating before the first step, which came later, changes none of them.

Why 2e-6: the pins were recorded on one CPU, and another CPU's float32 kernels sum in another order.
On a 2-core AMD EPYC with AVX512-BF16, code that matches the pins to 1e-6 on the CPU they were
recorded on (ff18f35) gave them to at most 1.05e-6 of their values, and each `margins` (chosen minus
rejected: two rewards near 1.0 whose difference is 0.02) to 3.6e-7 absolute, 1.7e-5 of itself. So a
margin's scale is that of the two rewards it is the difference of. A changed formula (a term dropped,
a baseline over another batch) moves these metrics by 1e-3 or more."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.objectives.pinned_runs import RUNS, run

pytestmark = pytest.mark.slow  # four short runs: ~20 s of CPU

PINS = json.loads((Path(__file__).parent / "pins.json").read_text())


REL = 2e-6


def tolerance(key: str, pinned: dict) -> float:
    """2e-6 of the metric's scale (the module doc says why), and 1e-9 for values near 0."""
    if key.endswith("margins"):  # chosen - rejected: rounded as its two operands are
        prefix = key[: -len("margins")]
        scale = abs(pinned[prefix + "chosen"]) + abs(pinned[prefix + "rejected"])
    else:
        scale = abs(pinned[key])
    return REL * scale + 1e-9


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
                assert abs(got[key] - value) <= tolerance(key, want), (name, got["step"], key, got[key], value)
            else:
                assert got[key] == value, (name, got["step"], key)
