"""The model-task table and what it says about architectures, offline; the compiler's task rules;
the classification metrics against scikit-learn."""

from __future__ import annotations

import typing

import pytest
import torch

from ditty.cli import main
from ditty.config.sections import DataConfig, ModelConfig
from ditty.metrics.classification import ClassificationCounts
from ditty.metrics.task_metrics import TaskMetric
from ditty.models.task_support import auto_mapping, supported_tasks, task_of_saved_model, task_problem
from ditty.models.tasks import TASKS, model_task, transformers_class
from ditty.stages.loss import LossCalculator


@pytest.mark.parametrize("name", list(TASKS))
def test_every_table_entry_names_things_that_exist(name):
    import peft
    import transformers

    task = TASKS[name]
    assert transformers_class(task) is getattr(transformers, task.auto_class)
    assert task.peft_auto_class is None or getattr(peft, task.peft_auto_class)  # the adapter's loader
    assert auto_mapping(task.auto_mapping)  # read without importing transformers' modeling_auto
    assert task.peft_task_type is None or task.peft_task_type in peft.TaskType.__members__
    assert isinstance(task.loss(None), LossCalculator)  # the default loss, built from [train]
    assert task.metrics and all(isinstance(make(), TaskMetric) for make in task.metrics)
    formats = typing.get_args(typing.get_type_hints(DataConfig)["format"])
    assert set(task.data_formats) <= set(formats)
    assert name in typing.get_args(typing.get_type_hints(ModelConfig)["task"])


def test_the_text_read_mappings_equal_transformers_own():
    from transformers.models.auto import modeling_auto

    for task in TASKS.values():
        assert auto_mapping(task.auto_mapping) == dict(getattr(modeling_auto, task.auto_mapping))


def test_what_each_family_supports():
    # a reward model is a sequence classifier with one score: every family with one can be a reward model
    assert supported_tasks({"model_type": "bert"}) == [
        "seq-classification",
        "token-classification",
        "masked-lm",
        "reward-model",
    ]
    assert supported_tasks({"model_type": "bert", "is_decoder": True})[0] == "causal-lm"
    assert "seq2seq" in supported_tasks({"model_type": "t5"}) and "causal-lm" not in supported_tasks(
        {"model_type": "t5"}
    )
    assert supported_tasks({"model_type": "llama"})[:2] == ["causal-lm", "seq-classification"]
    message, fix = task_problem({"model_type": "distilbert"}, model_task("causal-lm"))
    assert "distilbert is an encoder-only model" in message and "seq-classification" in fix
    assert task_problem({"model_type": "mystery", "auto_map": {}}, model_task("seq2seq")) is None  # remote code


def test_classification_counts_match_scikit_learn():
    from sklearn.metrics import accuracy_score, f1_score

    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (200,), generator=generator)
    predictions = torch.where(torch.rand(200, generator=generator) < 0.6, labels, torch.randint(0, 5, (200,)))
    predictions[predictions == 4] = 3
    labels[:10] = -100  # not scored
    counts = ClassificationCounts(5)
    counts.add(predictions[:120], labels[:120])
    counts.add(predictions[120:], labels[120:])
    result = counts.result()
    scored = labels != -100
    assert result["accuracy"] == pytest.approx(accuracy_score(labels[scored], predictions[scored]))
    assert result["f1"] == pytest.approx(f1_score(labels[scored], predictions[scored], average="macro"))


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def recipe(tmp_path, text: str) -> str:
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return str(path)


def test_the_defaults_on_an_encoder_stop_at_check(capsys, tmp_path, task_models):
    code, _, err = run_cli(capsys, "check", recipe(tmp_path, f'[model]\npath = "{task_models["bert"]}"\n'))
    assert code == 2, err
    assert "`model.path` bert is an encoder-only model" in err
    assert "bert supports: seq-classification, token-classification, masked-lm" in err
    assert "fix: set model.task to one of seq-classification, token-classification, masked-lm" in err


def test_a_task_recipe_checks_and_says_what_it_builds(capsys, tmp_path, task_models, task_files):
    code, out, err = run_cli(
        capsys, "check", recipe(tmp_path, "[run]\nseed = 0\n"),
        "--model.path", task_models["bert"], "--model.task", "seq-classification",
        "--data.source", "file", "--data.path", task_files["classification"], "--data.format", "classification",
        "--data.max_seq_len", "128",  # the tiny BERT's positions: a longer max_seq_len is refused
    )  # fmt: skip
    assert code == 0, err
    assert f"pretrained {task_models['bert']} for seq-classification" in out


def test_task_misfits_are_all_reported(capsys, tmp_path, task_models):
    code, _, err = run_cli(
        capsys, "check", recipe(tmp_path, "[run]\nseed = 0\n"),
        "--model.path", task_models["t5"], "--model.task", "token-classification",
        "--data.format", "seq2seq", "--data.packing", "true", "--train.eval_samples", "8",
    )  # fmt: skip
    assert code == 2
    assert '`data.format` "seq2seq" is not a format of model.task = "token-classification"' in err
    assert 'fix: set data.format = "token_classification", or model.task = "seq2seq" for this data' in err
    assert '`data.packing` model.task = "token-classification" trains on one sample per row' in err
    assert '`train.eval_samples` has no effect because model.task = "token-classification"' in err
    code, _, err = run_cli(
        capsys,
        "check",
        recipe(tmp_path, "[run]\nseed = 0\n"),
        "--model.path",
        task_models["t5"],
        "--model.task",
        "seq2seq",
        "--data.format",
        "seq2seq",
        "--data.name",
        "topics",
    )
    assert code == 2 and "the built-in 'topics' dataset cannot be read as data.format = \"seq2seq\"" in err


def test_saved_models_say_their_task(task_models):
    assert task_of_saved_model(task_models["t5"]).name == "seq2seq"
    assert task_of_saved_model(task_models["bert"]).name == "masked-lm"
