"""A LoRA sequence classifier's final/ loads the way the docs show (docs/objectives/model-tasks.md),
with the label names, and carries ditty's model card instead of peft's template."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ditty.cli import main
from tests.tasks.models import save_encoder

PAGE = Path(__file__).resolve().parents[2] / "docs" / "objectives" / "model-tasks.md"
ROWS = [
    ("the team scored a goal", "sport"),
    ("the coach and the player", "sport"),
    ("bread and soup for dinner", "food"),
    ("cheese salad recipe", "food"),
    ("rain and wind tomorrow", "weather"),
    ("a sunny forecast", "weather"),
]


def readme_block(needle: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    return next(block for block in blocks if needle in block)


@pytest.mark.slow  # a tiny BERT saved, trained for 2 steps with LoRA, merged and loaded: ~30 s
def test_lora_classifier_loads_with_pipeline_as_the_readme_shows(tmp_path, capsys):
    import json

    base = save_encoder(tmp_path / "bert", "bert")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in ROWS * 4))
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[model]\npath = "{base}"\ntask = "seq-classification"\n\n'
        f'[data]\nsource = "file"\npath = "{data}"\nformat = "classification"\nmax_seq_len = 32\n\n'
        '[peft]\nkind = "lora"\nr = 4\nalpha = 8\n\n'
        "[train]\nsteps = 2\nglobal_batch_size = 4\nmicro_batch_size = 4\n\n[logging]\nprogress = false\n"
    )
    run = tmp_path / "runs" / "my-classifier"
    assert main(["run", str(recipe), "--run.output_dir", str(run)]) == 0, capsys.readouterr().err
    capsys.readouterr()

    code = readme_block('pipeline("text-classification"').replace("runs/my-classifier", str(run))
    namespace: dict = {}
    exec(compile(code, str(PAGE), "exec"), namespace)  # the page's lines, as a user runs them
    printed = capsys.readouterr().out
    assert re.search(r"'label': '(sport|food|weather)'", printed), printed

    card = (run / "final" / "README.md").read_text()
    assert "[More Information Needed]" not in card
    for fact in ("`seq-classification`", base, "lora adapter (r 4, alpha 8)", str(data), "val_accuracy"):
        assert fact in card, fact
    assert 'pipeline("text-classification", model="final/merged")' in card

    # ditty generate's hint for a classifier names the folder the pipeline loads
    assert main(["generate", str(run), "hello"]) == 2
    assert f'model="{run}/final/merged"' in capsys.readouterr().err
