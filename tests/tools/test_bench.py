"""`tools/bench.py --quick` runs end to end, prints a well-formed table, and (by its own assertions)
ditty's weights after the overhead comparison equal the bare loop's and torchao's 8-bit AdamW state
is present on both ranks of a 2-process FSDP2 run. Speed is not asserted here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_quick_runs_and_prints_the_table():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "weights EQUAL the bare loop's" in out  # --quick also asserts it before printing
    assert "8-bit state PRESENT on every rank" in out  # likewise
    table = [line for line in out.splitlines() if line.startswith("|")]
    widths = {line.count("|") for line in table}
    assert widths == {8}, table  # every row has the header's 7 columns
    sections = {line.split("|")[1].strip() for line in table[2:] if not line.startswith("|---")}
    assert {"overhead", "packing", "compile"} <= sections
    for name in (
        "bare PyTorch loop",
        "ditty Trainer",
        "HF Trainer",
        "ditty, packing",
        "DataCollatorWithFlattening",
        "train.compile",
        "8-bit AdamW",
        "QLoRA",
        "LoRA",
        "FSDP2 2 ranks, 8-bit AdamW (torchao): rank 1",
    ):
        assert name in out, name
    ratios = re.findall(r"\| (\d+\.\d{3})x \|", out)
    assert ratios and all(float(r) > 0 for r in ratios)
