"""The issue's acceptance case: a user with a local pretrained BERT-style encoder directory finetunes
it as a classifier from a recipe alone (no Python file), through the command line: validation
accuracy is logged, final/ loads with AutoModelForSequenceClassification and its tokenizer, and its
predictions on the validation file give exactly the accuracy ditty logged. With `[peft] kind = "lora"`
the adapter loads with PeftModel on the base, and final/merged/ is a plain sequence classifier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ditty.cli import main
from tests.tasks.data import classification_rows
from tests.tasks.helpers import records

RECIPE = """
[run]
output_dir = "{out}"
device = "cpu"
num_threads = 1

[model]
path = "{model}"
task = "seq-classification"

[data]
source = "file"
path = "{train}"
val_path = "{val}"
format = "classification"
max_seq_len = 24

[train]
steps = 100
global_batch_size = 16
micro_batch_size = 16
eval_every = 100
log_every = 10
max_grad_norm = 0.0

[optimizer]
lr = {lr}

[scheduler]
kind = "constant"

[logging]
progress = false
{extra}
"""
LORA = '\n[peft]\nkind = "lora"\nr = 8\nalpha = 16.0\n\n[checkpoint]\nfinal_format = "merged"\n'


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def predicted_accuracy(model, tokenizer, rows: list[dict]) -> float:
    """Accuracy of `model` on the rows, one text at a time, as a user of transformers would compute it."""
    hits = 0
    model.eval()
    with torch.no_grad():
        for row in rows:
            logits = model(**tokenizer(row["text"], return_tensors="pt")).logits
            hits += model.config.id2label[int(logits.argmax(-1))] == row["label"]
    return hits / len(rows)


@pytest.mark.slow
@pytest.mark.parametrize("adapter", [False, True], ids=["full", "lora"])
def test_a_local_encoder_becomes_a_classifier_from_a_recipe_alone(tmp_path, task_models, adapter, capsys):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    val_rows = classification_rows(40, offset=400)
    recipe = tmp_path / "classify.toml"
    recipe.write_text(
        RECIPE.format(
            out=tmp_path / "run",
            model=task_models["bert"],
            train=write_jsonl(tmp_path / "train.jsonl", classification_rows(400)),
            val=write_jsonl(tmp_path / "val.jsonl", val_rows),
            lr=3e-3,
            extra=LORA if adapter else "",
        )
    )
    assert main(["check", str(recipe)]) == 0
    assert main(["run", str(recipe)]) == 0, capsys.readouterr().err[-3000:]
    logged = records(tmp_path / "run")[-1]
    assert logged["step"] == 100 and "val_accuracy" in logged and "val_f1" in logged
    # Four topics, chance is 0.25. The test model's body is random, which LoRA learns on slowly: its
    # case shows that what ditty logged is what the saved adapter computes.
    assert adapter or logged["val_accuracy"] > 0.6, logged

    final = tmp_path / "run" / "final"
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(task_models["bert"]).get_vocab()
    if not adapter:
        model = AutoModelForSequenceClassification.from_pretrained(final)
        assert model.config.id2label == {0: "food", 1: "music", 2: "sport", 3: "weather"}
        assert predicted_accuracy(model, tokenizer, val_rows) == logged["val_accuracy"]
        return
    from peft import PeftModel

    labels = json.loads((final / "labels.json").read_text())
    id2label = {int(i): name for i, name in labels["id2label"].items()}
    base = AutoModelForSequenceClassification.from_pretrained(
        task_models["bert"], id2label=id2label, label2id=labels["label2id"]
    )
    assert predicted_accuracy(PeftModel.from_pretrained(base, final), tokenizer, val_rows) == logged["val_accuracy"]
    merged = AutoModelForSequenceClassification.from_pretrained(final / "merged")
    assert type(merged).__name__ == "BertForSequenceClassification"
    assert predicted_accuracy(merged, tokenizer, val_rows) == logged["val_accuracy"]
