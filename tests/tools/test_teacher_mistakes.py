"""`tools/teacher_mistakes.py`, which counted the distilled students' mistakes that are their
teacher's: it scores the held-out problems ditty scores, counts what it says it counts, and refuses
a directory that is not a saved model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools import loading as tools

ROOT = Path(__file__).resolve().parents[2]


def load_tool():
    return tools.load_tool("teacher_mistakes")


def run_tool(monkeypatch, *args: str) -> None:
    tools.run_tool(monkeypatch, "teacher_mistakes", *args)


def test_the_counts_split_a_models_mistakes_by_the_teachers():
    truth = ["1", "2", "3", "4", "5"]
    teacher = ["1", "9", "8", "4", "5"]  # wrong on problems 1 and 2
    student = ["1", "9", "7", "0", "5"]  # its answer on 1, another wrong one on 2, and a mistake of its own
    counts = load_tool().mistake_counts(student, teacher, truth)
    assert counts == {"mistakes": 3, "on_teacher_mistakes": 2, "teacher_answer": 1, "on_the_rest": 1}
    assert load_tool().mistake_counts(truth, teacher, truth)["mistakes"] == 0


def test_the_held_out_problems_are_those_tiny_distill_scores(tiny_llama_dir, monkeypatch, capsys):
    from ditty.config.loader import load_recipe
    from ditty.data.build import builtin_rows

    data = load_recipe(str(ROOT / "recipes" / "tiny_distill.toml")).config.data
    tool = load_tool()
    assert (tool.NUM_SAMPLES, tool.VAL_FRACTION) == (data.num_samples, data.val_fraction)
    val = builtin_rows(data).val
    assert tool.held_out_problems() == list(zip(val["prompt"], val["completion"]))
    run_tool(monkeypatch, tiny_llama_dir, "--students", tiny_llama_dir)
    out = capsys.readouterr().out
    assert out.startswith(f"{len(val)} held-out problems")
    # the teacher as its own student: every mistake is the teacher's, with the teacher's answer
    row = next(line for line in out.splitlines() if line.startswith(f"| {tiny_llama_dir} |"))
    mistakes, shared, same, rest = (int(x) for x in row.strip(" |").split(" | ")[3:])
    assert mistakes == shared == same and rest == 0


def test_a_directory_without_a_model_is_exit_2(tmp_path, monkeypatch, capsys, tiny_llama_dir):
    with pytest.raises(SystemExit) as exit_info:
        run_tool(monkeypatch, tiny_llama_dir, "--baselines", str(tmp_path))
    assert exit_info.value.code == 2
    assert "not a saved model" in capsys.readouterr().err
