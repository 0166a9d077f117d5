"""A reward model scored outside ditty, by its model card's snippet in plain transformers, ranks the
held-out pairs as ditty's validation said (val_accuracy): chat pairs are rendered one way for
training and for scoring (ditty.data.conversation: the prompt with the generation prompt, the reply
through its first eos, never a second one)."""

from __future__ import annotations

import json
import re

from ditty.cli import main


def pairs(numbers):
    return [
        {
            "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "chosen": [{"role": "assistant", "content": str(a + b)}],
            "rejected": [{"role": "assistant", "content": str(a + b + 10)}],
        }
        for a, b in numbers
    ]


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_the_cards_snippet_reproduces_val_accuracy(tmp_path, tiny_llama_dir, capsys):
    numbers = [(a, b) for a in range(10, 50) for b in range(1, 6)]
    train = write(tmp_path / "train.jsonl", pairs([n for i, n in enumerate(numbers) if i % 4]))
    held_out = pairs([n for i, n in enumerate(numbers) if not i % 4])
    val = write(tmp_path / "val.jsonl", held_out)
    recipe = tmp_path / "rm.toml"
    recipe.write_text(
        f"""
[run]
output_dir = "{tmp_path / "run"}"
device = "cpu"
[model]
path = "{tiny_llama_dir}"
task = "reward-model"
[tokenizer]
chat_template = "plain"
[data]
source = "file"
path = "{train}"
val_path = "{val}"
format = "preference"
max_seq_len = 48
[train]
steps = 6
global_batch_size = 16
micro_batch_size = 16
log_every = 10
eval_samples = 64
precision = "fp32"
[optimizer]
lr = 3e-3
[logging]
progress = false
"""
    )
    assert main(["run", str(recipe)]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    reported = records[-1]["val_accuracy"]

    card = (tmp_path / "run" / "final" / "README.md").read_text()
    snippet = re.search(r"## Scoring.*?```python\n(.*?)```", card, re.S).group(1)
    scope = {"REPO_ID": str(tmp_path / "run" / "final")}
    exec(snippet, scope)  # the card's own code, nothing of ditty's
    score = scope["score"]
    right = sum(score(p["prompt"], p["chosen"]) > score(p["prompt"], p["rejected"]) for p in held_out)
    assert abs(right / len(held_out) - reported) <= 0.01, (right / len(held_out), reported)
    assert 0.0 < reported < 1.0  # a scorer that ranks some pairs each way, so agreeing is not trivial
