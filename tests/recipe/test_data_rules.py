"""Compiler rules for data at scale: [[data.sources]], data.streaming, [data.eval] and [eval]. Each rule
has a recipe it accepts and the mistakes it reports (all at once, with key, line and fix)."""

from __future__ import annotations

import importlib.util

from ditty.config.loader import parse_recipe
from ditty.recipe import compile_recipe

HEAD = """
[run]
output_dir = "{tmp}/run"
[model]
architecture = "llama"
[tokenizer]
kind = "byte"
[train]
steps = 10
global_batch_size = 8
micro_batch_size = 4
"""


def _problems(tmp_path, body: str, world_size: int = 1) -> dict[tuple[str, str], object]:
    plan = compile_recipe(parse_recipe(HEAD.format(tmp=tmp_path) + body.format(tmp=tmp_path)), world_size=world_size)
    return {(p.rule, p.key): p for p in plan.problems}


def _files(tmp_path, *names: str) -> None:
    for name in names:
        (tmp_path / name).write_text('{"text": "a"}\n')


def test_a_valid_mixture_has_no_problem_and_the_plan_shows_the_shares(tmp_path):
    _files(tmp_path, "a.jsonl", "b.jsonl", "v.jsonl")
    body = """
[data]
format = "text"
[[data.sources]]
path = "{tmp}/a.jsonl"
weight = 3
name = "web"
[[data.sources]]
source = "builtin"
dataset = "addition"
format = "prompt_completion"
weight = 1
[data.eval]
source = "file"
path = "{tmp}/v.jsonl"
"""
    # The only remark: a built-in source's exact-match score runs only when it trains alone.
    assert list(_problems(tmp_path, body)) == [("data.sources", "data.sources.1.dataset")]
    plan = compile_recipe(parse_recipe(HEAD.format(tmp=tmp_path) + body.format(tmp=tmp_path)))
    assert "mix of web 75% " in plan.summary() and "1 25% (addition)" in plan.summary()


def test_every_source_mistake_is_reported_at_once(tmp_path):
    _files(tmp_path, "a.jsonl")
    body = """
[data]
path = "{tmp}/a.jsonl"
group_by_length = true
[[data.sources]]
path = "{tmp}/missing.jsonl"
weight = 0
name = "web"
[[data.sources]]
source = "hub"
path = "{tmp}/a.jsonl"
name = "web"
val_fraction = 1.5
[[data.sources]]
source = "builtin"
dataset = "digits"
[data.eval]
source = "file"
name = "web"
"""
    found = _problems(tmp_path, body)
    errors = {key for (rule, key), p in found.items() if p.severity == "error"}
    assert errors == {
        "data.sources.0.path",
        "data.sources.0.weight",
        "data.sources.1.dataset",
        "data.sources.1.name",
        "data.sources.1.val_fraction",
        "data.sources.2.dataset",
        "data.eval.name",
        "data.eval.path",
    }
    warnings = {key for (rule, key), p in found.items() if p.severity == "warning"}
    assert {"data.sources.1.path", "data.path", "data.group_by_length"} <= warnings
    missing = found[("data.sources", "data.sources.0.path")]
    assert missing.line == 17 and "no file matches" in missing.message and missing.fix


def test_streaming_needs_steps_and_files_and_warns_about_fractions(tmp_path):
    body = """
[data]
streaming = true
val_fraction = 0.1
shuffle_buffer_size = 0
num_workers = -1
"""
    text = HEAD.replace("steps = 10\n", "") + body
    plan = compile_recipe(parse_recipe(text.format(tmp=tmp_path)))
    found = {(p.key, p.severity) for p in plan.problems}
    assert {
        ("data.streaming", "error"),  # no train.steps
        ("data.source", "error"),  # the default built-in dataset cannot stream
        ("data.val_fraction", "warning"),
        ("data.shuffle_buffer_size", "error"),
        ("data.num_workers", "error"),
    } <= found


def test_settings_without_effect_are_warnings(tmp_path):
    body = """
[data]
shuffle_buffer_size = 10
prefetch_factor = 4
[eval]
harness_limit = 5
"""
    found = _problems(tmp_path, body)
    assert {key for (_, key), p in found.items() if p.severity == "warning"} >= {
        "data.shuffle_buffer_size",
        "data.prefetch_factor",
        "eval.harness_limit",
    }


def test_a_data_path_without_a_file_source_is_an_error_not_the_builtin_data(tmp_path):
    """data.source defaults to "builtin": a recipe that names its file but not the source would
    otherwise train on the built-in addition data."""
    _files(tmp_path, "mine.jsonl")
    found = _problems(tmp_path, '[data]\npath = "{tmp}/mine.jsonl"\n')
    problem = found[("paths.data", "data.path")]
    assert problem.severity == "error" and "built-in 'addition' dataset" in problem.message
    assert 'data.source = "file"' in problem.fix
    with_source = _problems(tmp_path, '[data]\nsource = "file"\npath = "{tmp}/mine.jsonl"\n')
    assert ("paths.data", "data.path") not in with_source


def test_harness_rules(tmp_path, monkeypatch):
    body = """
[parallel]
kind = "fsdp"
[eval]
harness_tasks = ["arc_easy"]
harness_every = 5
harness_include_path = "{tmp}/nowhere"
harness_limit = 0
"""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a))
    found = _problems(tmp_path, body, world_size=2)
    assert {key for (rule, key), p in found.items() if rule == "eval.harness"} == {
        "eval.harness_tasks",  # not installed
        "eval.harness_every",  # sharded model during training
        "eval.harness_include_path",
        "eval.harness_limit",
    }
    assert "pip install 'ditty[eval]'" in found[("eval.harness", "eval.harness_tasks")].fix


def test_check_refuses_the_files_the_loader_would_refuse_before_reading_a_row(tmp_path):
    """An empty file, a suffix no reader takes, and files of mixed formats: `ditty check` says so,
    as `ditty run` does, instead of "ok"."""
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "rows.tsv").write_text("a\tb\n")
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "mixed" / "b.csv").write_text("text\nb\n")
    cases = {
        "empty.jsonl": "the data file '{tmp}/empty.jsonl' is empty",
        "rows.tsv": "cannot read files ending in .tsv",
        "mixed/*": "mix formats (.csv, .jsonl)",
    }
    good = '[data]\nsource = "file"\nformat = "text"\npath = "{tmp}/mixed/a.jsonl"\n'
    for name, words in cases.items():
        for key, body in (
            ("data.path", good.replace("mixed/a.jsonl", name)),
            ("data.val_path", good + f'val_path = "{{tmp}}/{name}"\n'),
        ):
            problem = _problems(tmp_path, body)[("paths.data", key)]
            assert words.format(tmp=tmp_path) in problem.message and problem.severity == "error", problem
