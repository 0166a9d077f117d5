"""Changed data is noticed: a data file rewritten with other rows, the same size and the same
modification time (a `cp -p`, `rsync -t` or restore does that).

The issue's case: the tokenisation cache was keyed on size and time, so the new file trained on the
old file's tokens (step-1 loss 5.5409, the old file's value, against 5.5023 with the new rows), and
a resume on the changed file said "resumed from step 20" and went on as if the rows were the old
ones. Now the cache is keyed on content, each checkpoint records every data file's fingerprint,
and a resume on changed data is exit 2 naming the file unless `checkpoint.force_resume`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.reliability.helpers import complete_steps, ditty, losses, no_traceback, write_recipe

ROWS = 240


def _rows(offset: int) -> bytes:
    """ROWS rows whose every line has the same length for any `offset` (2-digit sums of 1-digit terms)."""
    lines = [
        json.dumps({"prompt": f"{(i + offset) % 9 + 1}+{(i * 7 + offset) % 9}=", "completion": f"{i % 90 + 10}"})
        for i in range(ROWS)
    ]
    return ("\n".join(lines) + "\n").encode()


def _rewrite_keeping_size_and_time(path: Path, content: bytes) -> None:
    before = path.stat()
    assert len(content) == before.st_size
    path.write_bytes(content)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _recipe_on(tmp_path: Path, data: Path, out: str, steps: int = 4) -> Path:
    recipe = write_recipe(tmp_path, steps=steps, out=out, name=f"{out}.toml")
    text = recipe.read_text().replace(
        'source = "builtin"\nname = "addition"', f'source = "file"\npath = "{data}"\ncache_dir = "{tmp_path / "cache"}"'
    )
    recipe.write_text(text.replace("num_samples = 240\n", ""))
    return recipe


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_rewritten_data_file_misses_the_cache_and_a_resume_on_it_is_refused(tmp_path, trial):
    trial.update(
        fault="data file rewritten: same rows count, size and mtime",
        injected="train.jsonl rewritten with other rows, its size and modification time kept",
    )
    data = tmp_path / "train.jsonl"
    data.write_bytes(_rows(0))
    first = ditty("run", str(_recipe_on(tmp_path, data, "old")))
    assert first.code == 0, first.err[-3000:]
    old_losses = losses(tmp_path / "old")

    new_content = _rows(3)
    assert new_content != _rows(0)
    _rewrite_keeping_size_and_time(data, new_content)

    # The cache: a new run on the rewritten file tokenises the new rows, as a run with a fresh cache does.
    again = ditty("run", str(_recipe_on(tmp_path, data, "new")))
    assert again.code == 0, again.err[-3000:]
    fresh_data = tmp_path / "fresh" / "train.jsonl"
    fresh_data.parent.mkdir()
    fresh_data.write_bytes(new_content)
    fresh_recipe = _recipe_on(tmp_path / "fresh", fresh_data, "run")
    fresh = ditty("run", str(fresh_recipe))
    assert fresh.code == 0, fresh.err[-3000:]
    assert losses(tmp_path / "new")[0] != old_losses[0]
    assert losses(tmp_path / "new")[0] == losses(tmp_path / "fresh" / "run")[0]

    # The resume: the old run, longer, on the rewritten file is refused, and nothing in it changes.
    old_run = tmp_path / "old"
    before = _snapshot(old_run)
    longer = _recipe_on(tmp_path, data, "old", steps=6)
    refused = ditty("run", str(longer))
    trial.update(exit_code=refused.code, lost_steps=0)
    assert refused.code == 2 and no_traceback(refused), refused.err[-3000:]
    assert f"the data changed since checkpoint {old_run / 'checkpoints' / 'step-4'} was saved: {data}" in refused.err
    assert "--checkpoint.force_resume true" in refused.err
    assert _snapshot(old_run) == before

    # The old run is finished: extending it is asked for in so many words (test_finished_runs.py).
    forced = ditty("run", str(longer), "--checkpoint.force_resume", "true", "--checkpoint.overwrite_finished", "true")
    assert forced.code == 0 and "resumed from step 4" in forced.out, forced.err[-3000:]
    assert "resuming on changed data" in forced.err and complete_steps(old_run)[-1] == 6
