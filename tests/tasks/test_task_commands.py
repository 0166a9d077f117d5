"""`ditty generate`, `ditty export` and `ditty push` follow the model task of a run."""

from __future__ import annotations

import json

import pytest
import torch

from ditty.cli import main
from ditty.train.pipeline import call_model


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_generate_refuses_a_classifier_and_writes_with_a_seq2seq_model(capsys, trained):
    run = trained["seq-classification-bert"]["run_dir"]
    code, _, err = run_cli(capsys, "generate", run, "the team")
    assert code == 2
    assert "holds a seq-classification model, which does not generate text" in err
    assert 'pipeline("text-classification"' in err
    code, out, err = run_cli(capsys, "generate", trained["seq2seq-t5"]["run_dir"], "rev abc=", "--max-new-tokens", "4")
    assert code == 0, err
    code, out, err = run_cli(
        capsys, "generate", trained["seq2seq-bart-lora"]["run_dir"], "rev abc=", "--max-new-tokens", "4"
    )
    assert code == 0, err  # an adapter of a seq2seq model, through peft's AutoPeftModelForSeq2SeqLM


@pytest.mark.slow
def test_export_rebuilds_a_classifier_with_its_labels(capsys, tmp_path, trained):
    from transformers import AutoModelForSequenceClassification

    run = trained["seq-classification-bert"]
    code, _, err = run_cli(capsys, "export", run["run_dir"], "-o", tmp_path / "full")
    assert code == 0, err
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "full")
    assert list(model.config.id2label.values()) == list(run["trainer"].data.labels.names)
    with torch.no_grad():
        torch.testing.assert_close(call_model(model.eval(), run["batch"], {}, lm=True).logits, run["logits"])

    adapter = trained["seq-classification-deberta-v2-lora"]
    code, _, err = run_cli(capsys, "export", adapter["run_dir"], "-o", tmp_path / "merged", "--merge-lora")
    assert code == 0, err
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged")
    assert type(merged).__name__ == "DebertaV2ForSequenceClassification"
    with torch.no_grad():
        logits = call_model(merged.eval(), adapter["batch"], {}, lm=True).logits
    torch.testing.assert_close(logits, adapter["logits"], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_the_model_card_says_the_task_and_its_metrics(monkeypatch, trained):
    import ditty.checkpoint.hub as hub
    from ditty.cli.push import push_run

    pushed = []
    monkeypatch.setattr(hub, "push_folder", lambda folder, **kwargs: pushed.append((folder, kwargs)) or "url")
    run = trained["seq-classification-bert"]["run_dir"]
    assert push_run(str(run), repo_id="me/topics") == "url"
    card = (run / "final" / "README.md").read_text()
    assert 'pipeline_tag: "text-classification"' in card and "for the task `seq-classification`" in card
    assert "AutoModelForSequenceClassification.from_pretrained(REPO_ID)" in card and "| val_accuracy |" in card

    adapter = trained["token-classification-roberta-lora"]["run_dir"]
    push_run(str(adapter), repo_id="me/tags")
    card = (adapter / "final" / "README.md").read_text()
    assert "from peft import AutoPeftModelForTokenClassification" in card and "labels.json" in card
    assert json.loads((adapter / "final" / "labels.json").read_text())["num_labels"] == 5
