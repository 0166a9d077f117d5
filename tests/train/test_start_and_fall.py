"""A post-training stage read against its start: `ditty check` warns when its learning rate is above
the one its start (a ditty run's final/) finished training at; a run whose held-out result falls well
below the start's says so at that evaluation, naming optimizer.lr; and `train.stop_when` can stop on
such a fall ("val_exact_match <= start - 0.2").

The start is real and quick: a tiny Llama trained in seconds to answer "7" to every prompt (held-out
exact match 1.0), then GRPO from it at a learning rate far above its last one, which breaks it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ditty.config.stopping import parse_stop_condition
from ditty.train.fall import fall_warning
from tests.train.test_resume import RANDOM_LLAMA
from tests.train.test_resume import ditty as run_ditty

SFT = """
[run]
output_dir = "{out}"
device = "cpu"
num_threads = 1

[model]
{model}

[tokenizer]
kind = "byte"

[data]
source = "file"
path = "{data}"
format = "prompt_completion"
max_seq_len = 16
val_fraction = 0.1
val_exact_match = true

[train]
steps = 40
global_batch_size = 16
micro_batch_size = 16
log_every = 10
eval_every = 40
eval_samples = 8

[optimizer]
lr = 1e-2

[scheduler]
kind = "cosine"
warmup_steps = 5
min_lr_ratio = 0.1

[logging]
progress = false
"""

GRPO = """
[run]
output_dir = "{out}"
device = "cpu"
num_threads = 1

[model]
path = "{start}"

[data]
source = "file"
path = "{data}"
format = "prompt"
max_seq_len = 16
val_fraction = 0.1

[train]
steps = 6
global_batch_size = 32
micro_batch_size = 32
log_every = 1
eval_every = 2
eval_samples = 8

[optimizer]
lr = {lr}

[scheduler]
kind = "constant"

[rl]
kind = "grpo"
group_size = 4
max_new_tokens = 3
rewards = ["ditty.objectives.rewards.builtin_rewards:exact_match"]

[logging]
progress = false
"""


def _rows(path: Path, column: str) -> Path:
    with path.open("w") as f:
        for a in range(10):
            for b in range(10):
                f.write(json.dumps({"prompt": f"{a}+{b}=", column: "7"}) + "\n")
    return path


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """A ditty run's final/ that answers "7" to everything, and the prompt rows for a stage after it."""
    folder = tmp_path_factory.mktemp("start")
    recipe = folder / "sft.toml"
    data = _rows(folder / "sft.jsonl", "completion")
    recipe.write_text(SFT.format(out=folder / "sft", model=RANDOM_LLAMA, data=data))
    done = run_ditty("run", str(recipe))
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (folder / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["val_exact_match"] == 1.0
    return folder / "sft" / "final", _rows(folder / "prompts.jsonl", "answer"), records[-1]["lr"]


def _grpo(tmp_path: Path, start, lr: float, *flags: str):
    final, prompts, _ = start
    recipe = tmp_path / "grpo.toml"
    recipe.write_text(GRPO.format(out=tmp_path / "grpo", start=final, data=prompts, lr=lr))
    return recipe, [*flags]


def test_check_warns_of_a_rate_above_the_one_the_start_finished_at(tmp_path, start):
    last = start[2]
    recipe, _ = _grpo(tmp_path, start, 10 * last)
    above = run_ditty("check", str(recipe))
    assert above.returncode == 0, above.stderr
    assert "`optimizer.lr` is" in above.stderr and "10.0x the learning rate its start" in above.stderr
    assert f"set optimizer.lr to {last:.3g} or below" in above.stderr
    below = run_ditty("check", str(recipe), "--optimizer.lr", str(last))
    assert below.returncode == 0 and "learning rate its start" not in below.stderr
    # An adapter starts at zero and trains parameters of its own: not warned.
    lora = run_ditty("check", str(recipe), "--peft.kind", "lora", "--peft.target_modules", '["q_proj","v_proj"]')
    assert lora.returncode == 0 and "learning rate its start" not in lora.stderr
    # RAdam's first steps are not whole-rate steps: not warned.
    radam = run_ditty("check", str(recipe), "--optimizer.kind", "radam")
    assert radam.returncode == 0 and "learning rate its start" not in radam.stderr


def test_the_schedule_end_is_read_when_the_run_left_no_metrics(tmp_path, start):
    import shutil

    from ditty.recipe.start_rules import finished_learning_rate

    copy = tmp_path / "run" / "final"
    shutil.copytree(start[0], copy)  # final/ without its run's metrics.jsonl
    rate, where = finished_learning_rate(str(copy))
    # the schedule's last step (cosine towards 0.1 of 1e-2) is the rate the run logged last
    assert rate == pytest.approx(start[2], rel=1e-9) and "end of the schedule" in where
    assert finished_learning_rate(str(tmp_path)) is None  # not a ditty run's final/


def test_a_fall_below_the_start_is_named_and_stop_when_can_stop_on_it(tmp_path, start):
    recipe, _ = _grpo(tmp_path, start, 0.5)
    done = run_ditty("run", str(recipe), "--train.stop_when", "val_exact_match <= start - 0.3")
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    evaluations = [(r["step"], r["val_exact_match"]) for r in records if "val_exact_match" in r]
    assert evaluations[0] == (0, 1.0) and evaluations[-1][1] <= 0.7, evaluations
    assert "held-out val_exact_match fell from 1.000 at step 0" in done.stderr
    assert "optimizer.lr is 0.5" in done.stderr
    assert "(val_exact_match <= start - 0.3) (train.stop_when)" in done.stdout
    assert evaluations[-1][0] < 6  # stopped at the fall, before train.steps


def test_relative_conditions_parse_and_need_an_evaluation_at_the_start(tmp_path, start):
    condition = parse_stop_condition("val_exact_match <= start - 0.2")
    assert condition.met({"val_exact_match": 0.7}, {"val_exact_match": 0.95}) is not None
    assert condition.met({"val_exact_match": 0.8}, {"val_exact_match": 0.95}) is None
    factor = parse_stop_condition("val_reward <= 0.8 * start")
    assert str(factor) == "val_reward <= 0.8 * start" and factor.met({"val_reward": 0.5}, {"val_reward": 1.0})
    recipe, _ = _grpo(tmp_path, start, 1e-4)
    refused = run_ditty(
        "check", str(recipe), "--train.stop_when", "val_reward <= 0.8 * start", "--train.eval_at_start", "false"
    )
    assert refused.returncode == 2 and "does not evaluate at step 0" in refused.stderr, refused.stderr


def test_the_fall_warning_reads_the_headline_metric():
    start = {"val_exact_match": 0.97, "val_loss": 0.1}
    assert fall_warning(start, {"val_exact_match": 0.93}, 20, 1e-4) is None  # a small dip
    text = fall_warning(start, {"val_exact_match": 0.24}, 20, 1.5e-4)
    assert "fell from 0.970 at step 0 to 0.240 at step 20" in text and "optimizer.lr is 0.00015" in text
    assert fall_warning({"val_loss": 0.1}, {"val_loss": 5.0}, 20, 1e-4) is None  # no headline metric
    assert fall_warning({"val_reward": 0.2}, {"val_reward": 0.05}, 5, 1e-4) is not None
