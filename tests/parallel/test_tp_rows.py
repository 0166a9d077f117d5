"""The rows that read more than per-token log-probabilities, under tensor parallel at tp 2 x dp 2 (4 real
gloo processes) against one process:

- online pairs (sampled with generate on the sharded policy, paired, scored on vocabulary shards; tied
  groups dropped, so a micro-batch may hold only filler pairs);
- GKD, the teacher split like the student and the divergence summed on vocabulary shards
  (ditty.objectives.jsd_shards): data-only steps, on-policy steps with the hard-label term, and the
  teacher's mistakes corrected from the data;
- the reward model (a sequence classifier: its score head replicated and run sequence parallel), as
  users run it (`ditty run tiny_reward ... --nproc-per-node 4`), whose final/ loads with
  AutoModelForSequenceClassification and scores as the one-process model does.

Each row's losses over 3 steps agree within 1e-5 and its weights after them within 1e-5 (the
sums over vocabulary and sequence pieces round differently from the whole ones).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.objectives import test_distill, test_online_pairs
from tests.objectives.row_workers import row_steps
from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def online_pairs_recipe(tmp_path, model):
    # judged by length, so some groups tie and are dropped; one generate call per prompt (a call's samples
    # depend on the prompts it holds, and the data-parallel ranks hold halves)
    extra = 'generation_batch_size = 1\nrewards = ["tests.rl.rewards_for_tests:length_reward"]'
    path = test_online_pairs.recipe(tmp_path, model, data_format="prompt", extra=extra)
    path.write_text(path.read_text().replace('[peft]\nkind = "lora"', '[peft]\nkind = "none"'))
    return path


def distill_recipe(tmp_path, teacher, extra):
    path = test_distill.distill_recipe(tmp_path, teacher, extra)
    path.write_text(path.read_text().replace("global_batch_size = 8", "global_batch_size = 16"))
    return path


RECIPES = {
    "online-pairs": online_pairs_recipe,
    "gkd-data-steps": lambda t, m: distill_recipe(t, m, "data_only_steps = 3\nbeta = 0.5\nsft_weight = 0.5"),
    "gkd-on-policy": lambda t, m: distill_recipe(t, m, "data_only_steps = 0\nbeta = 0.5\nsft_weight = 0.5"),
    "gkd-teacher-mistakes": lambda t, m: distill_recipe(t, m, 'data_only_steps = 0\nteacher_mistakes = "data"'),
}


@pytest.mark.parametrize("row", sorted(RECIPES))
def test_the_row_at_tp_2_by_dp_2_trains_as_one_process(tmp_path, tiny_llama_dir, row):
    recipe = str(RECIPES[row](tmp_path, tiny_llama_dir))
    (one,) = run_ranks(row_steps, 1, recipe, "none", str(tmp_path / "one"), STEPS, timeout=400)
    four = run_ranks(row_steps, 4, recipe, "fsdp", str(tmp_path / "four"), STEPS, 2, timeout=400)
    assert len(set(one["losses"])) == STEPS  # it trains
    assert all(rank["losses"] == four[0]["losses"] for rank in four)
    for a, b in zip(one["losses"], four[0]["losses"]):
        assert abs(a - b) < 1e-5, (one["losses"], four[0]["losses"])
    assert [m.keys() for m in four[0]["metrics"]] == [m.keys() for m in one["metrics"]]
    if row == "online-pairs":
        assert 0 < min(m["online/tied_groups"] for m in one["metrics"]) < 1  # some groups pair, some tie
    if row.startswith("gkd"):
        shares = [m["distill/on_policy_share"] for m in four[0]["metrics"]]
        assert shares == [m["distill/on_policy_share"] for m in one["metrics"]]
        assert (max(shares) > 0) == (row != "gkd-data-steps")  # the on-policy rows sample
    if row == "gkd-teacher-mistakes":
        corrected = [m["distill/corrected"] for m in one["loss_metrics"]]
        assert max(corrected) > 0
        assert [m["distill/corrected"] for m in four[0]["loss_metrics"]] == pytest.approx(corrected, abs=1e-6)
    worst = max(float((one["state"][k] - four[0]["state"][k]).abs().max()) for k in one["state"])
    assert worst < 1e-5, worst


SHORT = [
    "--train.steps", "3", "--train.global_batch_size", "8", "--train.micro_batch_size", "2", "--train.log_every",
    "1", "--train.eval_every", "0", "--train.eval_samples", "16", "--scheduler.warmup_steps", "0",
    "--logging.progress", "false", "--checkpoint.every", "0", "--run.device", "cpu", "--data.num_samples", "400",
]  # fmt: skip
NOT_COMPARED = ("tokens_per_s", "elapsed_s", "mfu", "hfu", "peak_mem_mb")


def test_the_reward_model_at_tp_2_by_dp_2_trains_as_one_process(tmp_path, tiny_llama_dir):
    def ditty(output_dir, *extra):
        command = [sys.executable, "-m", "ditty", "run", "tiny_reward", "--model.path", tiny_llama_dir, *SHORT]
        command += ["--run.output_dir", str(tmp_path / output_dir), *extra]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = (tmp_path / output_dir / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k not in NOT_COMPARED} for line in lines]

    one = ditty("one")
    four = ditty("four", "--parallel.kind", "fsdp", "--parallel.tp", "2", "--nproc-per-node", "4")
    steps = [r for r in one if "loss" in r]
    assert len(steps) == 3 and "rewards/margins" in steps[0] and "val_accuracy" in steps[-1]
    assert [r.keys() for r in four] == [r.keys() for r in one]
    for expected, actual in zip(one, four):
        for key, value in expected.items():
            assert actual[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (key, actual[key], value)

    import torch
    from transformers import AutoModelForSequenceClassification

    alone = AutoModelForSequenceClassification.from_pretrained(tmp_path / "one" / "final")
    split = AutoModelForSequenceClassification.from_pretrained(tmp_path / "four" / "final")
    assert split.get_input_embeddings().weight.shape[0] == 259 and split.score.weight.shape == (1, 64)
    texts = torch.tensor([[1, 60, 50, 43, 61, 2], [1, 61, 43, 61, 51, 2]])
    with torch.no_grad():
        assert split(texts).logits.flatten().tolist() == pytest.approx(alone(texts).logits.flatten().tolist(), abs=1e-5)
