"""Planned vs measured memory of real CPU trainings: the table in BENCHMARKS.md ("Planner").

    python tools/plan_validate.py            # tiny and ~100M Llama: full, LoRA, QLoRA, 8-bit AdamW, fsdp x 2;
                                             # one packed row of 16,384 tokens ("long")
    python tools/plan_validate.py --quick    # the tiny model only

Each case is `ditty.train.Trainer` on a fresh process per rank (tests/plan/measure.py): parameter,
gradient and optimizer-state bytes must equal the plan exactly; the peak resident memory is
compared with the plan's CPU peak (the framework baseline included).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.plan.measure import run_case, save_model, table  # noqa: E402

CASES = [
    ("tiny", "full", 1),
    ("tiny", "lora", 1),
    ("tiny", "qlora", 1),
    ("tiny", "adamw8bit", 1),
    ("tiny", "full", 2),
    ("100m", "full", 1),
    ("100m", "lora", 1),
    ("100m", "qlora", 1),
    ("100m", "adamw8bit", 1),
    ("100m", "full", 2),
    ("long", "full", 1),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model only")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    comparisons = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="ditty-plan-validate-") as work:
        models = {}
        for model, method, world in CASES:
            if args.quick and model != "tiny":
                continue
            if model not in models:
                models[model] = save_model(model, os.path.join(work, model))
            out = os.path.join(work, f"run-{model}-{method}-{world}")
            case_started = time.time()
            comparisons += run_case(model, models[model], out, method, world)
            print(f"{model} {method} x{world}: {time.time() - case_started:.0f} s", file=sys.stderr, flush=True)
    print(table(comparisons))
    exact = all(c.exact for c in comparisons)
    worst = max(abs(c.peak_error) for c in comparisons)
    elapsed = time.time() - started
    print(f"\nexact parameter/gradient/optimizer bytes: {exact}; worst peak error {worst:.1%}; {elapsed:.0f} s")
    return 0 if exact and worst <= 0.20 else 1


if __name__ == "__main__":
    sys.exit(main())
