"""Every model task trains end to end on one process, with and without LoRA, and its final/ is what
transformers alone loads: the task's Auto class (and `transformers.pipeline`), or for an adapter
`PeftModel.from_pretrained` on the base, with final/merged/ a plain model of the task's class. The
reloaded models compute the logits of the model ditty trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ditty.models.tasks import model_task, transformers_class
from ditty.train.pipeline import call_model
from tests.tasks.helpers import CASES, records

METRICS = {
    "seq-classification": {"val_loss", "val_accuracy", "val_f1"},
    "token-classification": {"val_loss", "val_accuracy", "val_f1"},
    "seq2seq": {"val_loss", "val_exact_match"},
    "masked-lm": {"val_loss", "val_perplexity"},
}


def logits_of(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return call_model(model.eval(), batch, {}, lm=True).logits


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_task_trains_and_logs_its_metrics(trained, case):
    run = trained[case.id]
    last = records(run["run_dir"])[-1]
    assert METRICS[case.task] <= set(last), last
    assert run["result"].steps == 2 and all(0 <= last[k] <= 1 for k in ("val_accuracy", "val_f1") if k in last)
    final = Path(run["run_dir"]) / "final"
    assert (final / "tokenizer.json").is_file() or (final / "tokenizer_config.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_final_loads_with_transformers_and_computes_the_trained_logits(trained, task_models, case):
    import transformers
    from peft import PeftModel

    run = trained[case.id]
    final = Path(run["run_dir"]) / "final"
    task = model_task(case.task)
    auto = transformers_class(task)
    if not case.adapter:
        model = auto.from_pretrained(final)
        assert type(model).__name__ == auto._model_mapping[type(model.config)].__name__
        torch.testing.assert_close(logits_of(model, run["batch"]), run["logits"], atol=1e-5, rtol=1e-5)
    else:
        labels = {}
        if (final / "labels.json").is_file():
            saved = json.loads((final / "labels.json").read_text())
            labels = {"id2label": {int(i): n for i, n in saved["id2label"].items()}, "label2id": saved["label2id"]}
        base = auto.from_pretrained(task_models[case.family], **labels)
        adapted = PeftModel.from_pretrained(base, final)
        torch.testing.assert_close(logits_of(adapted, run["batch"]), run["logits"], atol=1e-5, rtol=1e-5)
        merged = auto.from_pretrained(final / "merged")
        assert not hasattr(merged, "peft_config") and isinstance(merged, transformers.PreTrainedModel)
        torch.testing.assert_close(logits_of(merged, run["batch"]), run["logits"], atol=1e-4, rtol=1e-4)
    if task.labels:
        config = json.loads(((final / "merged") if case.adapter else final).joinpath("config.json").read_text())
        names = list(run["trainer"].data.labels.names)
        assert [config["id2label"][str(i)] for i in range(len(names))] == names
        assert config["label2id"] == {name: i for i, name in enumerate(names)}


@pytest.mark.slow
def test_transformers_pipelines_run_the_saved_models(trained):
    from transformers import pipeline

    classify = pipeline("text-classification", model=str(trained["seq-classification-bert"]["run_dir"] / "final"))
    assert classify("the team will score")[0]["label"] in {"food", "music", "sport", "weather"}
    tag = pipeline("token-classification", model=str(trained["token-classification-distilbert"]["run_dir"] / "final"))
    assert {entity["entity"] for entity in tag("the team will score")} <= {"O", "food", "music", "sport", "weather"}
    fill = pipeline("fill-mask", model=str(trained["masked-lm-roberta"]["run_dir"] / "final"))
    assert len(fill("the team will [MASK]")) == 5
    merged = pipeline(
        "text-classification", model=str(trained["seq-classification-deberta-v2-lora"]["run_dir"] / "final" / "merged")
    )
    assert merged("rain and fog")[0]["label"] in {"food", "music", "sport", "weather"}
