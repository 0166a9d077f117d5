"""A run of each new objective row killed with SIGKILL resumes bitwise: RLOO (the rollout stream), GKD
(the data cursor, the on-policy coin and the student's samples) and online pairs (the prompt cursor
and, mid-refresh, the pairs not yet trained on). The kill comes from a test-only preprocessor at a
fixed step (tests.train.resume_hooks:SignalAt) after the checkpoint of step 2. On 2 ranks, what each
rank sampled and had not trained on yet (online pairs mid-refresh, GRPO's rollouts mid-reuse) resumes
on that rank, and another world size is refused while a rank holds some; under tensor parallel
GRPO (tp 2 x dp 2) and GKD (tp 2) resume bitwise too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.train.test_resume import complete_steps, ditty

pytestmark = pytest.mark.slow

COMMON = """
[run]
output_dir = "{out}"
device = "cpu"
seed = 0
[train]
steps = 5
global_batch_size = 8
micro_batch_size = 4
log_every = 1
eval_every = 0
eval_samples = 8
precision = "fp32"
[checkpoint]
every = 2
every_minutes = 0.0
[[pipeline.preprocessors]]
use = "tests.train.resume_hooks:SignalAt"
[logging]
progress = false
"""

ROWS = {
    "rloo": """
[model]
path = "{model}"
[data]
source = "builtin"
name = "addition"
format = "prompt"
max_seq_len = 32
num_samples = 200
[rl]
kind = "grpo"
advantage = "rloo"
group_size = 4
rewards = ["tests.rl.rewards_for_tests:text_hash_reward"]
[rollout]
max_new_tokens = 4
""",
    "gkd": """
[model]
init = "random"
architecture = "llama"

[model.config]
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 2
max_position_embeddings = 64
tie_word_embeddings = false
[tokenizer]
kind = "byte"
[data]
source = "builtin"
name = "addition"
format = "prompt_completion"
max_seq_len = 32
num_samples = 200
[distill]
kind = "gkd"
teacher = "{model}"
lmbda = 0.5
[rollout]
max_new_tokens = 4
""",
    "online-pairs": """
[model]
path = "{model}"
[data]
source = "builtin"
name = "addition"
format = "preference"
max_seq_len = 32
num_samples = 200
[preference]
pairs = "online"
refresh_every = 3
[rl]
group_size = 4
rewards = ["tests.rl.rewards_for_tests:text_hash_reward"]
[rollout]
max_new_tokens = 4
""",
}


def records(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    drop = ("tokens_per_s", "elapsed_s", "mfu", "hfu", "peak_mem_mb", "rollout/generate_s", "rollout/tokens_per_s")
    return [{k: v for k, v in r.items() if k not in drop and not k.startswith("rollout/generation")} for r in rows]


def uninterrupted_then_killed(
    tmp_path: Path, text: str, model: str, launch: list, signal_at: str
) -> tuple[list[dict], Path, Any]:
    """(the records of run "a" trained through its 5 steps, the recipe of run "b", b's killed process):
    the same recipe (`text` under COMMON) launched with `launch`, b killed where `signal_at` says
    (tests.train.resume_hooks:SignalAt), after its checkpoint of step 2 and before another."""

    def write(name: str) -> Path:
        out = tmp_path / name
        out.mkdir()
        path = out / "recipe.toml"
        path.write_text(COMMON.format(out=out / "run") + text.format(model=model))
        return path

    done = ditty("run", str(write("a")), *launch)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = records(tmp_path / "a" / "run")
    assert len([r for r in expected if "loss" in r]) == 5
    recipe = write("b")
    killed = ditty("run", str(recipe), *launch, env={"DITTY_TEST_SIGNAL_AT": signal_at})
    assert killed.returncode != 0, killed.stderr[-2000:]
    assert complete_steps(tmp_path / "b" / "run") == ["step-2"]
    return expected, recipe, killed


@pytest.mark.parametrize("row", sorted(ROWS))
def test_a_killed_run_of_the_row_resumes_bitwise(tmp_path, tiny_llama_dir, row):
    # killed during step 4, after step-2
    expected, recipe, killed = uninterrupted_then_killed(tmp_path, ROWS[row], tiny_llama_dir, [], "3:1:KILL")
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    resumed = ditty("run", str(recipe))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert records(tmp_path / "b" / "run") == expected  # bitwise


# GRPO's rollouts trained on three steps in a row: the checkpoint of step 2 holds them mid-reuse
REUSE = (
    ROWS["rloo"]
    .replace('advantage = "rloo"\n', "")
    .replace("group_size = 4", "group_size = 4\nupdates_per_rollout = 3")
)


@pytest.mark.parametrize("row", ["online-pairs", "grpo-reuse"])
def test_a_killed_two_rank_run_resumes_each_ranks_samples_bitwise(tmp_path, tiny_llama_dir, row):
    text = REUSE if row == "grpo-reuse" else ROWS[row]
    two = ["--nproc-per-node", "2", "--parallel.kind", "ddp"]
    # one micro-batch per rank: killed during step 4
    expected, recipe, _ = uninterrupted_then_killed(tmp_path, text, tiny_llama_dir, two, "3:0:KILL")
    for command in ("check", "run"):  # refused before any weights load
        one = ditty(command, str(recipe))
        assert one.returncode == 2, one.stderr[-3000:]
        assert "`checkpoint.resume`" in one.stderr and "resume on 2 processes" in one.stderr
    resumed = ditty("run", str(recipe), *two)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert records(tmp_path / "b" / "run") == expected  # bitwise


@pytest.mark.xdist_group("parallel")
@pytest.mark.parametrize("row, processes", [("grpo-reuse", 4), ("gkd", 2)])
def test_a_killed_run_under_tp_resumes_bitwise(tmp_path, tiny_llama_dir, row, processes):
    """Killed during step 4, the run resumes from step 2 with the uninterrupted run's every record,
    bitwise: GRPO at tp 2 x dp 2 (4 processes) mid-reuse of its rollouts (each data-parallel rank's,
    shared by its tp group; online pairs mid-refresh keep theirs the same way), GKD at tp 2 with its
    teacher split like the student and its on-policy coin and samples."""
    text = REUSE if row == "grpo-reuse" else ROWS[row]
    launch = ["--nproc-per-node", str(processes), "--parallel.kind", "fsdp", "--parallel.tp", "2"]
    expected, recipe, _ = uninterrupted_then_killed(tmp_path, text, tiny_llama_dir, launch, "3:0:KILL")
    resumed = ditty("run", str(recipe), *launch)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert records(tmp_path / "b" / "run") == expected  # bitwise
