"""Episodes of several turns, killed with SIGKILL mid-episode (inside an environment's step, in the
middle of a step's rollout), resume bitwise; and 2 ranks (gloo; DDP and FSDP) play and train them
exactly as 1 process. The checkpoint holds the sampler's position (the prompt cursor: sampling is
seeded by the prompts' global positions and the turn) and, between steps, no episode is open: a
step's episodes all end inside its rollout, so the killed step's episodes are played again, the same."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ditty.config.sections import ModelConfig
from ditty.config.writer import recipe_to_toml
from tests.parallel.harness import run_ranks
from tests.rl.helpers import grpo_config, save_turn_ending_llama
from tests.train.test_resume import complete_steps, ditty

pytestmark = pytest.mark.slow
ENV = "tests.rl.environments_for_tests:KilledMidEpisode"


def episode_config(tmp_path: Path, model_dir: str, **train):
    config = grpo_config(
        tmp_path,
        train=dict(steps=6, **train),
        checkpoint=dict(every=3, every_minutes=0.0),
        environment=ENV,
        rewards=["tests.rl.rewards_for_tests:text_hash_reward"],
        max_new_tokens=6,
        max_turns=3,
        max_episode_tokens=24,
    )
    return replace(config, model=ModelConfig(path=model_dir))


def records(run_dir: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    keys = ("step", "loss", "grad_norm", "reward", "env/turns", "env/episode_tokens", "completions/mean_length")
    return [tuple(r.get(k) for k in keys) for r in rows if "loss" in r]


def test_sigkill_mid_episode_resumes_bitwise(tmp_path):
    model = save_turn_ending_llama(tmp_path / "model")
    paths = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        paths[name] = tmp_path / name / "episodes.toml"
        paths[name].write_text(recipe_to_toml(episode_config(tmp_path / name, model)))
    done = ditty("run", str(paths["a"]))
    assert done.returncode == 0, done.stderr[-3000:]
    expected = records(tmp_path / "a" / "run")
    assert len(expected) == 6 and max(r[4] for r in expected) > 1.2  # episodes of several turns
    assert len({r[3] for r in expected}) > 1

    # 8 episodes a step: reset 35 opens the 3rd episode of the 5th step, after step-3 was saved
    killed = ditty("run", str(paths["b"]), env={"DITTY_TEST_KILL_AT_RESET": "35"})
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    assert complete_steps(tmp_path / "b" / "run") == ["step-3"]
    resumed = ditty("run", str(paths["b"]))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 3" in resumed.stdout
    assert records(tmp_path / "b" / "run") == expected  # bitwise


STEPS = 3


def three_steps(rank: int, world_size: int, out_dir: str, kind: str, model_dir: str) -> dict:
    from ditty.config.sections import ParallelConfig
    from ditty.train import Trainer

    config = episode_config(Path(out_dir), model_dir, global_batch_size=8, micro_batch_size=4)
    config = replace(
        config, parallel=ParallelConfig(kind=kind), rollout=replace(config.rollout, generation_batch_size=1)
    )
    trainer = Trainer(config)
    losses, metrics = [], []
    for _ in range(STEPS):
        batches = trainer.stream.next_step()
        step = trainer.stream.step_metrics()
        metrics.append({k: step[k] for k in ("reward", "env/turns", "env/episode_tokens", "env/truncated")})
        losses.append(trainer.train_step(batches).loss)
        trainer.state.step += 1
    full = trainer.engine.full_state_dict(trainer.model)
    module = trainer.engine.unwrap(trainer.model)
    state = {k: v.detach().clone() for k, v in (full if full is not None else module.state_dict()).items()}
    trainer.run_lock.release()
    return {"losses": losses, "metrics": metrics, "state": state if rank == 0 else {}}


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_two_ranks_play_and_train_episodes_as_one_process(tmp_path, kind):
    model = save_turn_ending_llama(tmp_path / "model")
    (one,) = run_ranks(three_steps, 1, str(tmp_path / "one"), "none", model, timeout=400)
    two = run_ranks(three_steps, 2, str(tmp_path / "two"), kind, model, timeout=400)
    assert two[0]["metrics"] == one["metrics"]  # the same episodes
    assert max(m["env/turns"] for m in one["metrics"]) > 1.2
    for a, b in zip(one["losses"], two[0]["losses"]):
        assert abs(a - b) < 1e-6, (one["losses"], two[0]["losses"])
    worst = max(float((one["state"][k] - two[0]["state"][k]).abs().max()) for k in one["state"])
    assert worst < 1e-6, worst
