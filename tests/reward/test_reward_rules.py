"""`model.task = "reward-model"` in the task table and the compiler: it reads preference pairs, refuses
packing with the reason, builds a one-score classifier, and a saved one says its task."""

from __future__ import annotations

import json

from ditty.cli import main
from ditty.models.build import label_config
from ditty.models.task_support import task_of_saved_model
from ditty.models.tasks import TASKS

REWARD = [
    "--model.task", "reward-model", "--model.init", "random", "--model.architecture", "llama",
    "--tokenizer.kind", "byte", "--data.source", "builtin", "--data.name", "addition",
]  # fmt: skip


def check(capsys, *args) -> tuple[int, str]:
    code = main(["check", "tiny_sft", *[str(a) for a in args]])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_the_row_says_how_a_reward_model_is_built_and_trained():
    task = TASKS["reward-model"]
    assert task.auto_class == "AutoModelForSequenceClassification" and task.peft_task_type == "SEQ_CLS"
    assert task.data_formats == ("preference",) and task.num_labels == 1 and task.head and not task.packing
    assert task.peft_auto_class == "AutoPeftModelForSequenceClassification"
    assert label_config(None, "reward-model") == {"num_labels": 1}
    assert label_config(None, "seq-classification") == {}


def test_a_reward_model_on_preference_pairs_checks(capsys):
    code, out = check(capsys, *REWARD, "--data.format", "preference")
    assert code == 0, out
    assert "for reward-model" in out


def test_a_reward_model_needs_preference_data(capsys):
    code, out = check(capsys, *REWARD)  # tiny_sft reads prompt_completion
    assert code == 2
    assert (
        '`data.format` "prompt_completion" is not a format of model.task = "reward-model" (it reads "preference")'
        in out
    )
    assert 'fix: set data.format = "preference", or model.task = "causal-lm" for this data' in out


def test_packing_is_refused_with_the_reason(capsys):
    code, out = check(capsys, *REWARD, "--data.format", "preference", "--data.packing", "true")
    assert code == 2
    assert '`data.packing` model.task = "reward-model" trains on one sample per row' in out
    assert "a reward model scores a whole text at its last token" in out


def test_a_saved_one_score_classifier_is_a_reward_model(tmp_path):
    for labels, task in ((1, "reward-model"), (2, "seq-classification")):
        directory = tmp_path / str(labels)
        directory.mkdir()
        config = {
            "model_type": "llama",
            "architectures": ["LlamaForSequenceClassification"],
            "id2label": {str(i): f"LABEL_{i}" for i in range(labels)},
        }
        (directory / "config.json").write_text(json.dumps(config))
        assert task_of_saved_model(str(directory)).name == task
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"task_type": "SEQ_CLS"}))
    assert task_of_saved_model(str(adapter)).name == "seq-classification"  # no labels.json: a classifier
    (adapter / "labels.json").write_text(json.dumps({"num_labels": 1, "id2label": {"0": "LABEL_0"}}))
    assert task_of_saved_model(str(adapter)).name == "reward-model"
