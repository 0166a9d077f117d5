"""Every data feature works for a model task as for a causal LM (one data pipeline): a classifier
mixes [[data.sources]] by token shares and validates on [data.eval]; the same mixture streamed
with dataloader workers resumes exactly after kill -9; a malformed line is skipped and counted."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ditty.config.sections import DataConfig, DataEvalConfig, DataSourceConfig
from ditty.config.writer import recipe_to_toml
from ditty.train import Trainer
from tests.tasks.data import classification_rows
from tests.tasks.helpers import Case, losses, records, task_config
from tests.tasks.test_task_resume import run_killed

CLASSIFIER = Case("seq-classification", "bert")


def _write(path, rows, *, malformed_at=None) -> str:
    lines = [json.dumps(row) for row in rows]
    if malformed_at is not None:
        lines.insert(malformed_at, '{"text": "the team", "label": ')  # cut off mid-row
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def _mixture(tmp_path, **data) -> DataConfig:
    first = _write(tmp_path / "news.jsonl", classification_rows(40))
    second = _write(tmp_path / "chat.jsonl", classification_rows(30, 40))
    held_out = _write(tmp_path / "held-out.jsonl", classification_rows(12, 70))
    return DataConfig(
        format="classification",
        max_seq_len=32,
        val_fraction=0.0,  # held out: [data.eval] only
        sources=[
            DataSourceConfig(path=first, weight=0.7, name="news"),
            DataSourceConfig(path=second, weight=0.3, name="chat"),
        ],
        eval=DataEvalConfig(source="file", path=held_out, name="held-out"),
        **data,
    )


def test_a_classifier_mixes_sources_by_token_share_and_validates_on_data_eval(tmp_path, task_models, task_files):
    config = task_config(tmp_path / "run", CLASSIFIER, task_models, task_files, steps=12)
    config = replace(config, data=_mixture(tmp_path), train=replace(config.train, eval_every=6))
    Trainer(config).train()
    logged = records(tmp_path / "run")
    last = [r for r in logged if "tokens/source/news" in r][-1]
    news, chat = last["tokens/source/news"], last["tokens/source/chat"]
    assert abs(news / (news + chat) - 0.7) <= 0.02 and abs(chat / (news + chat) - 0.3) <= 0.02, last
    evaluated = [r for r in logged if "val_accuracy" in r]
    assert evaluated and 0.0 <= evaluated[-1]["val_accuracy"] <= 1.0 and "val_f1" in evaluated[-1]
    assert "val_loss/held-out" in evaluated[-1] and evaluated[-1]["val_loss"] == evaluated[-1]["val_loss/held-out"]


@pytest.mark.slow
def test_a_streamed_classifier_with_workers_resumes_after_kill_9_with_bitwise_equal_losses(
    tmp_path, task_models, task_files, capsys
):
    config = task_config(tmp_path / "run", CLASSIFIER, task_models, task_files, steps=6, every=2, signal_hook=True)
    config = replace(config, data=_mixture(tmp_path, streaming=True, num_workers=2, shuffle_buffer_size=16))
    reference = replace(config, run=replace(config.run, output_dir=str(tmp_path / "reference")))
    Trainer(reference).train()
    expected = losses(tmp_path / "reference")
    assert [step for step, _ in expected] == list(range(1, 7))
    assert any("tokens/source/chat" in r for r in records(tmp_path / "reference"))

    recipe = tmp_path / "recipe.toml"
    recipe.write_text(recipe_to_toml(config))
    killed = run_killed(recipe, "4:1:KILL")  # 0-based step 4 = the 5th, its second micro-batch
    assert killed.returncode in (-9, 137), killed.stderr[-3000:]
    assert [step for step, _ in losses(tmp_path / "run")] == [1, 2, 3, 4]

    Trainer(config).train()  # the same recipe again: resumes from step-4
    assert "resumed from step 4" in capsys.readouterr().out
    assert losses(tmp_path / "run") == expected


def test_a_malformed_line_of_a_classification_file_is_skipped_and_reported(tmp_path, task_models, task_files):
    path = _write(tmp_path / "train.jsonl", classification_rows(24), malformed_at=5)
    config = task_config(tmp_path / "run", CLASSIFIER, task_models, task_files, steps=2)
    config = replace(config, data=replace(config.data, path=path, on_bad_rows="skip"))
    result = Trainer(config).train()
    steps = [r for r in records(tmp_path / "run") if "loss" in r]
    assert steps and all(r["skipped_rows"] == 1 for r in steps)
    assert result.steps == 2


def test_a_malformed_line_of_a_streamed_classification_file_is_skipped(tmp_path, task_models, task_files, caplog):
    # The case: skipped when read whole, exit 2 ("Failed to load JSON ... ArrowInvalid") when streamed.
    path = _write(tmp_path / "train.jsonl", classification_rows(24), malformed_at=5)
    config = task_config(tmp_path / "run", CLASSIFIER, task_models, task_files, steps=2)
    data = replace(config.data, path=path, on_bad_rows="skip", streaming=True, val_fraction=0.0)
    with caplog.at_level("WARNING", logger="ditty.data"):
        result = Trainer(replace(config, data=data)).train()
    assert result.steps == 2
    assert f"{path}:6: malformed JSON" in caplog.text  # named where it was left out
