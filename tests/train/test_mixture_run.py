"""A recipe mixing two files 70/30 trains (issue #18 acceptance): per-source token counts in
metrics.jsonl within 2% of 70/30, adding up to `tokens`, and a validation loss per held-out set
(per source and [data.eval]) beside the one over all of them."""

from __future__ import annotations

import json
import os

import pytest

from ditty.config.loader import load_recipe
from ditty.recipe import compile_recipe
from ditty.train import Trainer
from tests.train.helpers import read_jsonl

RECIPE = """
[run]
output_dir = "{tmp}/run"
device = "cpu"
num_threads = 1

[model]
path = "{model}"

[data]
format = "text"
max_seq_len = 64
packing = true
val_fraction = 0.1
num_workers = 1

[[data.sources]]
path = "{tmp}/web.jsonl"
weight = 0.7
name = "web"

[[data.sources]]
path = "{tmp}/qa.jsonl"
format = "prompt_completion"
weight = 0.3
name = "qa"
val_fraction = 0.0
val_path = "{tmp}/qa-val.jsonl"

[data.eval]
source = "file"
path = "{tmp}/held-out.jsonl"

[train]
steps = 10
global_batch_size = 8
micro_batch_size = 4
log_every = 1
eval_every = 5
eval_samples = 0

[optimizer]
lr = 3e-3

[logging]
progress = false
"""


def _jsonl(path, rows) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory, tiny_llama_dir):
    tmp = tmp_path_factory.mktemp("mixture")
    _jsonl(tmp / "web.jsonl", [{"text": f"page {i}: " + "lorem ipsum " * (1 + i % 4)} for i in range(120)])
    qa = [{"prompt": f"{i}+{i % 7}=", "completion": str(i + i % 7)} for i in range(90)]
    _jsonl(tmp / "qa.jsonl", qa[:80])
    _jsonl(tmp / "qa-val.jsonl", qa[80:])
    _jsonl(tmp / "held-out.jsonl", [{"text": f"held out {i}"} for i in range(6)])
    path = tmp / "recipe.toml"
    path.write_text(RECIPE.format(tmp=tmp, model=tiny_llama_dir))
    loaded = load_recipe(str(path))
    plan = compile_recipe(loaded)
    assert not plan.problems, [p.format() for p in plan.problems]
    assert "mix of web 70% " in plan.summary()
    result = Trainer(loaded.config).train()
    return result, read_jsonl(os.path.join(result.run_dir, "metrics.jsonl"))


def test_token_counts_per_source_follow_the_weights(mixed_run):
    _, records = mixed_run
    assert [r["step"] for r in records] == list(range(1, 11))
    for record in records:
        assert record["tokens/source/web"] + record["tokens/source/qa"] == record["tokens"]
    last = records[-1]
    assert abs(last["tokens/source/web"] / last["tokens"] - 0.7) < 0.02
    assert abs(last["tokens/source/qa"] / last["tokens"] - 0.3) < 0.02


def test_every_held_out_set_is_validated_and_reported(mixed_run):
    result, records = mixed_run
    evaluated = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evaluated] == [5, 10]
    for record in evaluated:
        parts = [record[f"val_loss/{name}"] for name in ("web", "qa", "eval")]
        assert min(parts) <= record["val_loss"] <= max(parts)  # all sets together, weighted by their tokens
    assert set(result.eval_metrics) >= {"val_loss", "val_loss/web", "val_loss/qa", "val_loss/eval"}
