"""A reward model's final/ loads with transformers alone (AutoModelForSequenceClassification, num_labels 1)
and, scored on the held-out addition pairs there, gives the val_accuracy training reported; the lines of
docs/objectives/reward-models.md run on it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ditty.cli import main
from tests.reward.helpers import records

PAGE = Path(__file__).resolve().parents[2] / "docs" / "objectives" / "reward-models.md"


def held_out_pairs(num_samples: int, fraction: float) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected) of the built-in addition task's held-out problems."""
    from ditty.data.builtin import generate_problems, split_problems, wrong_answer

    _, held_out = split_problems(generate_problems("addition", num_samples), fraction)
    return [(prompt, answer, wrong_answer(prompt, answer)) for prompt, answer in held_out]


def scores(model, tokenizer, prompt: str, completions: list[str]) -> torch.Tensor:
    """The model's score of each completion after `prompt`, encoded as ditty encodes a pair side."""
    rows = [
        tokenizer(prompt)["input_ids"]
        + tokenizer(text, add_special_tokens=False)["input_ids"]
        + [tokenizer.eos_token_id]
        for text in completions
    ]
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
    attention_mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]


def held_out_accuracy(run_dir: Path, num_samples: int, fraction: float) -> float:
    """The fraction of the held-out addition pairs that final/, loaded with transformers alone, scores
    the right way round."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    final = run_dir / "final"
    model = AutoModelForSequenceClassification.from_pretrained(str(final)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(final))
    assert model.config.num_labels == 1 and model.config.pad_token_id == tokenizer.pad_token_id
    pairs = held_out_pairs(num_samples, fraction)
    right = 0
    for prompt, chosen, rejected in pairs:
        chosen_score, rejected_score = scores(model, tokenizer, prompt, [chosen, rejected])
        right += int(chosen_score > rejected_score)
    return right / len(pairs)


def readme_scores(run_dir: Path, capsys) -> list[float]:
    """What the page's example prints for a run's final/ (the scores of a correct and a wrong sum)."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    code_text = next(b for b in blocks if "runs/tiny_reward/final" in b).replace("runs/tiny_reward", str(run_dir))
    capsys.readouterr()
    exec(compile(code_text, str(PAGE), "exec"), {})  # the page's lines, as a user runs them
    return [float(v) for v in re.findall(r"-?\d+\.\d+", capsys.readouterr().out)]


@pytest.mark.slow  # a 2-step run, then 40 held-out pairs scored through transformers
def test_final_scores_match_what_validation_reported(tmp_path, capsys):
    """A short run: transformers alone, on the held-out pairs, gives the val_accuracy training logged."""
    from tests.reward.helpers import reward_recipe

    assert main(["run", reward_recipe(tmp_path, steps=2)]) == 0, capsys.readouterr().err
    logged = [r for r in records(tmp_path / "run") if "val_accuracy" in r][-1]
    accuracy = held_out_accuracy(tmp_path / "run", 200, 0.1)
    assert accuracy == pytest.approx(logged["val_accuracy"], abs=1e-9)
    assert len(readme_scores(tmp_path / "run", capsys)) == 2
