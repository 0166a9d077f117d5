"""2 ranks (gloo; DDP and FSDP) train GRPO exactly as 1 process over 3 steps: the same prompts draw the same
completions (sampling seeded by the prompts' global positions), the rewards are gathered in global
order for the advantages, and the loss is normalised over the global batch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.parallel.harness import run_ranks
from tests.rl.helpers import grpo_config

pytestmark = pytest.mark.slow

STEPS = 3


def train_three_steps(rank: int, world_size: int, out_dir: str, kind: str) -> dict:
    from pathlib import Path

    from ditty.config.sections import ParallelConfig
    from ditty.train import Trainer

    config = grpo_config(
        Path(out_dir),
        train=dict(steps=STEPS, global_batch_size=8, micro_batch_size=4),
        rewards=["tests.rl.rewards_for_tests:length_reward"],
        generation_batch_size=1,
        loss="dapo",
    )
    config = replace(config, parallel=ParallelConfig(kind=kind))
    trainer = Trainer(config)
    losses, rewards = [], []
    for _ in range(STEPS):
        batches = trainer.stream.next_step()
        rewards.append(trainer.stream.step_metrics()["reward"])
        losses.append(trainer.train_step(batches).loss)
        trainer.state.step += 1
    full = trainer.engine.full_state_dict(trainer.model)  # FSDP gathers the shards; None: the module holds them
    module = trainer.engine.unwrap(trainer.model)
    state = {k: v.detach().clone() for k, v in (full if full is not None else module.state_dict()).items()}
    state = state if rank == 0 else {}  # rank 0 holds the gathered weights
    trainer.run_lock.release()
    return {"losses": losses, "rewards": rewards, "state": state}


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process(tmp_path, kind):
    (one,) = run_ranks(train_three_steps, 1, str(tmp_path / "one"), "none", timeout=400)
    two = run_ranks(train_three_steps, 2, str(tmp_path / "two"), kind, timeout=400)
    assert two[0]["rewards"] == one["rewards"]  # the same rollouts
    assert len(set(one["rewards"])) > 1
    for a, b in zip(one["losses"], two[0]["losses"]):
        assert abs(a - b) < 1e-6, (one["losses"], two[0]["losses"])
    worst = max(float((one["state"][k] - two[0]["state"][k]).abs().max()) for k in one["state"])
    assert worst < 1e-6, worst
    assert any(abs(x) > 0 for x in one["losses"])
