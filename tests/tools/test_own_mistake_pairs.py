"""`tools/own_mistake_pairs.py`, which made the fixed own-mistake pairs of the online-pairs record:
with `--rejected synthetic` its files hold exactly the rows `tiny_dpo` reads from the built-in
addition pairs (so a run on them measures only the rejected answers), and with `own` a training
pair's rejected answer is the model's greedy answer wherever that answer is wrong."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tools import loading as tools


def load_tool():
    return tools.load_tool("own_mistake_pairs")


def run_tool(monkeypatch, *args: str) -> None:
    tools.run_tool(monkeypatch, "own_mistake_pairs", *args)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_synthetic_files_hold_the_built_in_pairs(tmp_path, monkeypatch):
    from ditty.config.data import DataConfig
    from ditty.data.build import builtin_rows

    run_tool(monkeypatch, "unused", str(tmp_path), "--rejected", "synthetic")
    rows = builtin_rows(DataConfig(source="builtin", name="addition", format="preference", num_samples=20000))
    for written, dataset in ((read(tmp_path / "train.jsonl"), rows.train), (read(tmp_path / "val.jsonl"), rows.val)):
        assert written == list(dataset)


def test_own_rejected_answers_are_the_models_wrong_greedy_answers(tmp_path, monkeypatch, tiny_llama_dir):
    run_tool(monkeypatch, tiny_llama_dir, str(tmp_path), "--rejected", "own")
    pairs = read(tmp_path / "train.jsonl")
    prompts = sorted({pair["prompt"] for pair in pairs})[:64]
    greedy = load_tool().greedy_answers(tiny_llama_dir, prompts)
    by_prompt = {pair["prompt"]: pair for pair in pairs}
    for prompt in prompts:
        pair = by_prompt[prompt]
        assert pair["rejected"] != pair["chosen"]
        if greedy[prompt] and greedy[prompt] != pair["chosen"]:  # a wrong, non-empty answer
            assert pair["rejected"] == greedy[prompt]
    assert any(by_prompt[p]["rejected"] == greedy[p] for p in prompts)  # a random model's answers are wrong


def test_an_empty_or_right_greedy_answer_keeps_the_synthetic_rejected_one():
    tool = load_tool()
    synthetic = tool.wrong_answer("12+30=", "42")
    assert tool.rejected_for("12+30=", "42", "") == synthetic  # an empty completion is a bad preference row
    assert tool.rejected_for("12+30=", "42", None) == synthetic
    assert tool.rejected_for("12+30=", "42", "42") == synthetic
    assert tool.rejected_for("12+30=", "42", "99") == "99"


def test_bad_input_is_exit_2_and_existing_files_are_kept(tmp_path, monkeypatch, capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        run_tool(monkeypatch, str(tmp_path / "no_model"), str(tmp_path / "out"))
    assert exit_info.value.code == 2
    assert "not a saved model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

    (tmp_path / "train.jsonl").write_text("mine\n")
    with pytest.raises(SystemExit) as exit_info:
        run_tool(monkeypatch, "unused", str(tmp_path), "--rejected", "synthetic")
    assert exit_info.value.code == 2
    assert "already exist" in capsys.readouterr().err
    assert (tmp_path / "train.jsonl").read_text() == "mine\n"
    assert not (tmp_path / "val.jsonl").exists()
