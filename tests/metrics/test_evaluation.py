"""lm-evaluation-harness through ditty (issue #18), offline: a task defined locally in lm-eval's YAML
format over a local JSONL file. `[eval] harness_tasks` scores the live model during training and the
final model at the end; `ditty eval RUN` prints and records a score for the final model."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

pytest.importorskip("lm_eval")

from ditty.cli import main  # noqa: E402
from ditty.config.sections import DataConfig, EvalConfig  # noqa: E402
from ditty.evaluation import flatten_results  # noqa: E402
from ditty.train import Trainer  # noqa: E402
from tests.train.helpers import read_jsonl, small_config  # noqa: E402

TASK = """task: ditty_arith
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
SCORE = "harness/ditty_arith/acc"


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    rows = [
        {"question": f"{a}+{b}=", "choices": [str(a + b), str(a + b + 1)], "answer": 0}
        for a in range(4)
        for b in range(3)
    ]
    (folder / "arith.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "arith.yaml").write_text(TASK.format(data=folder / "arith.jsonl"))
    return folder


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory, tiny_llama_dir, tasks_dir):
    tmp = tmp_path_factory.mktemp("harness-run")
    config = small_config(tmp, tiny_llama_dir, "unused.jsonl", steps=4, log_every=1)
    config = replace(
        config,
        data=DataConfig(source="builtin", name="addition", num_samples=200, max_seq_len=32),
        eval=EvalConfig(harness_tasks=["ditty_arith"], harness_every=2, harness_include_path=str(tasks_dir)),
    )
    return Trainer(config).train()


def test_training_scores_the_live_model_and_the_final_model(scored_run):
    records = read_jsonl(os.path.join(scored_run.run_dir, "metrics.jsonl"))
    scored = [(r["step"], r[SCORE]) for r in records if SCORE in r]
    assert [step for step, _ in scored] == [2, 4]  # every 2 steps on the live model; step 4: final/
    assert all(0.0 <= score <= 1.0 for _, score in scored)
    assert scored_run.eval_metrics[SCORE] == scored[-1][1]
    card = open(os.path.join(scored_run.run_dir, "final", "README.md"), encoding="utf-8").read()
    assert f"| {SCORE} |" in card and "| val_loss |" in card


def test_ditty_eval_prints_and_records_a_score_for_the_final_model(scored_run, tasks_dir, capsys):
    run_dir = scored_run.run_dir
    code = main(["eval", run_dir, "--tasks", "ditty_arith", "--include-path", str(tasks_dir), "--limit", "6"])
    out = capsys.readouterr().out
    assert code == 0, out
    printed = float(out.split(SCORE)[1].split()[0])
    last = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))[-1]
    assert set(last) == {"step", SCORE} and last["step"] == 4 and abs(last[SCORE] - printed) < 1e-4
    assert f"| {SCORE} | {last[SCORE]:.6g} |" in open(os.path.join(run_dir, "final", "README.md")).read()
    # A model directory: printed, nothing recorded (there is no run).
    assert (
        main(["eval", os.path.join(run_dir, "final"), "--tasks", "ditty_arith", "--include-path", str(tasks_dir)]) == 0
    )
    assert SCORE in capsys.readouterr().out
    assert read_jsonl(os.path.join(run_dir, "metrics.jsonl"))[-1] == last


def test_ditty_eval_errors_are_user_errors(scored_run, tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--tasks", "ditty_arith"]) == 2
    assert "neither a run" in capsys.readouterr().err
    assert main(["eval", scored_run.run_dir, "--limit", "many"]) == 2
    assert "--limit takes a whole number" in capsys.readouterr().err


def test_results_flatten_to_named_scores():
    results = {"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": "N/A", "exact_match,strict": 0.25}}
    assert flatten_results(results) == {"harness/t/acc": 0.5, "harness/t/exact_match_strict": 0.25}


def test_the_harness_leaves_the_random_streams_of_training_alone(scored_run, tasks_dir):
    """lm-eval seeds the global generators; a run scored mid-way keeps its own (dropout) streams."""
    import random
    from pathlib import Path

    import numpy as np
    import torch

    from ditty.evaluation import harness_scores, load_model

    model, tokenizer = load_model(Path(scored_run.run_dir) / "final")
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    scores = harness_scores(model, tokenizer, ["ditty_arith"], include_path=str(tasks_dir), limit=4)
    assert SCORE in scores
    assert random.getstate() == before[0] and (np.random.get_state()[1] == before[1]).all()
    assert torch.equal(torch.get_rng_state(), before[2])


HUB_TASK = """task: ditty_hub_only
dataset_path: ditty-tests/never-downloaded
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


@pytest.fixture
def hub_task_dir(tmp_path):
    (tmp_path / "hub_only.yaml").write_text(HUB_TASK)
    return tmp_path


def test_ditty_eval_offline_says_the_task_s_data_is_not_available(tiny_llama_dir, hub_task_dir, capsys):
    import datasets.config
    import huggingface_hub.constants

    assert huggingface_hub.constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE  # conftest: offline
    code = main(["eval", tiny_llama_dir, "--tasks", "ditty_hub_only", "--include-path", str(hub_task_dir)])
    out = "".join(capsys.readouterr())
    assert code == 2, out
    assert "the data of lm-eval task ditty_hub_only is not available offline" in out, out
    assert "ditty-tests/never-downloaded" in out and "Traceback" not in out


def test_ditty_eval_with_an_unreachable_hub_gives_up_at_once(tiny_llama_dir, hub_task_dir, capsys, monkeypatch):
    import time

    import datasets.config
    import huggingface_hub.constants

    # A machine without network that was not told so: the Hub's address refuses connections.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    started = time.monotonic()
    code = main(["eval", tiny_llama_dir, "--tasks", "ditty_hub_only", "--include-path", str(hub_task_dir)])
    out = "".join(capsys.readouterr())
    assert code == 2, out
    assert "the data of lm-eval task ditty_hub_only is not available offline" in out, out
    assert "cannot reach the Hub at http://127.0.0.1:9" in out
    assert time.monotonic() - started < 20  # huggingface_hub's own retries take 25-50 s
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False  # the switch is put back
