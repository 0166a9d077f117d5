"""The bundled from-scratch task recipes (tiny_bert_topics, tiny_t5_reverse) run end to end through the
command line, as shipped except for a few steps on a little data, and their final/ loads with the
transformers Auto class of the task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ditty.cli import main

RECIPES = Path(__file__).resolve().parents[2] / "recipes"

# recipe -> (transformers Auto class of final/, the held-out metric it logs)
TASK_RECIPES = {
    "tiny_bert_topics": ("AutoModelForSequenceClassification", "val_accuracy"),
    "tiny_t5_reverse": ("AutoModelForSeq2SeqLM", "val_exact_match"),
}


def short_run_args(recipe: str, output_dir: Path) -> list[str]:
    """The recipe as shipped, for 5 steps on 200 samples with one evaluation at the end."""
    args = [
        str(RECIPES / f"{recipe}.toml"),
        "--run.output_dir",
        str(output_dir),
        "--run.device",
        "cpu",
        "--train.steps",
        "5",
        "--train.eval_every",
        "5",
        "--train.log_every",
        "1",
        "--data.num_samples",
        "200",
        "--data.val_fraction",
        "0.1",
        "--scheduler.warmup_steps",
        "0",
        "--checkpoint.every",
        "0",
        "--logging.progress",
        "false",
    ]
    if recipe == "tiny_t5_reverse":
        args += ["--train.eval_samples", "4"]
    return args


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(TASK_RECIPES))
def test_task_recipe_runs_five_steps_and_its_final_model_loads(recipe, tmp_path):
    import torch
    import transformers

    auto_class, metric = TASK_RECIPES[recipe]
    run_dir = tmp_path / "run"
    assert main(["run", *short_run_args(recipe, run_dir)]) == 0

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][-1] == 5
    evaluated = [r for r in records if metric in r]
    assert evaluated and evaluated[-1]["step"] == 5 and 0.0 <= evaluated[-1][metric] <= 1.0

    final = run_dir / "final"
    model = getattr(transformers, auto_class).from_pretrained(str(final)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(final))
    assert next(model.parameters()).dtype == torch.float32
    if recipe == "tiny_bert_topics":
        assert model.config.model_type == "bert"
        assert sorted(model.config.id2label.values()) == ["food", "music", "sport", "weather"]
        inputs = tokenizer(["the team will score a goal"], return_tensors="pt")
        with torch.no_grad():
            logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        assert logits.shape == (1, 4) and torch.isfinite(logits).all()
    else:
        assert model.config.model_type == "t5"
        inputs = tokenizer(["rev abcd="], return_tensors="pt")
        with torch.no_grad():
            out = model.generate(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=6
            )
        assert out.shape[0] == 1 and 1 < out.shape[1] <= 7
