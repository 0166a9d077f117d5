"""Bad data rows: each kind is reported by file and line (exit 2, no traceback), or skipped and counted.

The issue's cases: non-UTF-8 bytes (a UnicodeDecodeError traceback), a malformed JSON line among
10,000 (no line number), a row missing `completion` (trained silently as an empty answer), a null
field and a blank line (unreported), one 50 MB line (7 minutes and 3.5 GB before an error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ditty.config.errors import RecipeError
from ditty.data.sources import load_checked_files
from tests.reliability.helpers import REPO, ditty, no_traceback, write_recipe

FIELDS = {"prompt": "text", "completion": "text"}
ROWS = 10_000


def _rows(n: int) -> list[bytes]:
    return [
        json.dumps({"prompt": f"{i % 97}+{i % 89}=", "completion": str(i % 97 + i % 89)}).encode() for i in range(n)
    ]


BAD_LINES = {
    "malformed JSON": (b'{"prompt": "1+1=", "completion": "2"', "malformed JSON: Expecting ',' delimiter"),
    "bad encoding": (b'{"prompt": "1+\xff1=", "completion": "2"}', "bad encoding: byte 0xff at column 15 is not UTF-8"),
    "missing field": (b'{"prompt": "1+1="}', "'completion' is missing"),
    "null field": (b'{"prompt": "1+1=", "completion": null}', "'completion' is null"),
    "wrong type": (b'{"prompt": "1+1=", "completion": {"a": 2}}', "'completion' is an object, not text"),
    "blank line": (b"", "blank line (JSON lines hold one object per line)"),
    "not an object": (b'["1+1=", "2"]', "is a JSON list, not an object of fields"),
}


def _file_with(tmp_path, bad: bytes, at: int = 7_321) -> str:
    lines = _rows(ROWS)
    lines.insert(at - 1, bad)
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_each_bad_row_is_named_by_file_and_line(kind, tmp_path, trial):
    trial.update(fault=f"data: {kind}", injected=f"one bad line at line 7,321 of {ROWS + 1:,}")
    bad, reason = BAD_LINES[kind]
    path = _file_with(tmp_path, bad)
    with pytest.raises(RecipeError) as error:
        load_checked_files(path, key="data.path", cache_dir=str(tmp_path / "cache"), fields=FIELDS)
    trial.update(exit_code=2, lost_steps=0)
    text = error.value.format()
    assert f"{path}:7321: {reason}" in text, text
    assert "1 bad row" in text and 'data.on_bad_rows = "skip"' in text
    dataset, skipped = load_checked_files(
        path, key="data.path", cache_dir=str(tmp_path / "cache"), fields=FIELDS, on_bad_rows="skip"
    )
    assert skipped == 1 and len(dataset) == ROWS


def test_through_the_command_line_exit_2_and_skip_counts_in_metrics_and_summary(tmp_path, trial):
    trial.update(fault="data: several bad rows, on_bad_rows error then skip", injected="3 bad lines among 10,000")
    lines = _rows(ROWS)
    for at, key in ((10, "malformed JSON"), (500, "missing field"), (9000, "bad encoding")):
        lines[at - 1] = BAD_LINES[key][0]
    data = tmp_path / "train.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    recipe = write_recipe(tmp_path, steps=3)
    text = recipe.read_text().replace('source = "builtin"\nname = "addition"', f'source = "file"\npath = "{data}"')
    recipe.write_text(text)
    refused = ditty("run", str(recipe))
    assert refused.code == 2 and no_traceback(refused), refused.err[-2000:]
    assert f"3 bad rows in {data}" in refused.err
    assert all(f"{data}:{n}:" in refused.err for n in (10, 500, 9000))
    skipped = ditty("run", str(recipe), "--data.on_bad_rows", "skip")
    trial.update(exit_code=skipped.code, lost_steps=0)
    assert skipped.code == 0, skipped.err[-2000:]
    assert 'skipped 3 bad data rows (data.on_bad_rows = "skip")' in skipped.out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["skipped_rows"] == 3 for r in records)


SCAN = """
import os, resource, sys, time
from ditty.config.errors import RecipeError
from ditty.data.sources import load_checked_files
start = time.monotonic()
try:
    fields = {"prompt": "text", "completion": "text"}
    load_checked_files(sys.argv[1], key="data.path", cache_dir=sys.argv[2], fields=fields)
except RecipeError as error:
    print(error.format())
print("seconds", time.monotonic() - start)
# VmHWM: this process's peak resident memory since its exec (ru_maxrss would include the forking parent)
print("peak_kb", next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")))
"""


def test_a_50_mb_line_is_caught_at_once_in_bounded_memory(tmp_path, trial):
    trial.update(fault="data: one 50 MB line", injected="a 50 MB line among 10,000")
    path = _file_with(tmp_path, b'{"prompt": "' + b"7" * (50 << 20) + b'", "completion": "1"}', at=2)
    # A fresh interpreter, so its peak memory is the scan's own.
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SCAN, path, str(tmp_path / "cache")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    peak_mb = int(out.split("peak_kb")[1]) / 1024
    trial.update(exit_code=2, lost_steps=0, seconds=round(time.monotonic() - started, 1), peak_rss_mb=round(peak_mb))
    assert f"{path}:2: the line is {(50 << 20) + 33} bytes, longer than data.max_row_bytes = 16000000" in out, out
    assert peak_mb < 400, peak_mb  # the interpreter with datasets and pyarrow is about 160 MB of it
    assert float(out.split("seconds")[1].split()[0]) < 60
