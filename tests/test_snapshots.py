"""Error messages users see, pinned. After an intended change, regenerate with
`DITTY_UPDATE_SNAPSHOTS=1 pytest tests/test_snapshots.py` and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ditty.cli import main

HERE = Path(__file__).parent
BAD = HERE / "config" / "bad_recipes"
SNAPSHOTS = HERE / "snapshots"

CASES = {
    "typo_lr": ["check", "tests/config/bad_recipes/typo_lr.toml"],
    "ten_mistakes": ["check", "tests/config/bad_recipes/ten_mistakes.toml"],
    "cross_field": ["check", "tests/config/bad_recipes/cross_field.toml"],
    "negative_steps": ["check", "tests/config/bad_recipes/negative_steps.toml"],
    "wrong_kind": ["check", "tests/config/bad_recipes/wrong_kind.toml"],
    "invalid_syntax": ["check", "tests/config/bad_recipes/invalid_syntax.toml"],
    "duplicate_key": ["check", "tests/config/bad_recipes/duplicate_key.toml"],
    "invalid_key": ["check", "tests/config/bad_recipes/invalid_key.toml"],
    "non_finite": ["check", "tests/config/bad_recipes/non_finite.toml"],
    "missing_file": ["check", "tests/config/bad_recipes/does_not_exist.toml"],
    "bad_flags": [
        "check",
        "tests/config/bad_recipes/negative_steps.toml",
        "--train.stepz",
        "3",
        "--train.compile",
        "maybe",
    ],
    "no_recipe": ["run"],
    "pipeline_misfits": ["check", "tests/config/bad_recipes/pipeline_misfits.toml"],
    "pipeline_imports": ["check", "tests/config/bad_recipes/pipeline_imports.toml"],
    "encoder_as_causal_lm": ["check", "tests/config/bad_recipes/encoder_as_causal_lm.toml"],
    "task_misfits": ["check", "tests/config/bad_recipes/task_misfits.toml"],
    "data_sources": ["check", "tests/config/bad_recipes/data_sources.toml"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_error_message_snapshot(name, capsys, monkeypatch):
    monkeypatch.chdir(HERE.parent)
    code = main(CASES[name])
    err = capsys.readouterr().err
    assert code == 2
    snapshot = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("DITTY_UPDATE_SNAPSHOTS") or not snapshot.exists():
        snapshot.write_text(err)
        if not os.environ.get("DITTY_UPDATE_SNAPSHOTS"):
            pytest.fail(f"new snapshot written: {snapshot}; review and commit it")
    assert err == snapshot.read_text()
