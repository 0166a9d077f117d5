"""The rollout stream: the RL rows' micro-batches, made from the stream of prompts by the RL parts.

One `next_step()` on each rank:
1. takes this rank's prompts of the step from the prompt stream (global_batch_size / group_size
   prompts per step, the same global order and cursor as every format; whole groups per rank);
2. the environment plays `group_size` episodes of each with the sampler (ditty.objectives.rl.environment:
   one completion scored by the reward functions, or episodes of several turns; a failing reward
   function or environment stops the run, exit 2, before any update);
3. (rollout/generate_s times both);
4. every rank's rewards are gathered in global prompt order and the advantage estimator turns them
   into advantages (ditty.objectives.rl.advantages), of which the rank keeps its own;
5. the assembler cuts the rollouts into micro-batches (ditty.objectives.rl.assembler).
With `updates_per_rollout` > 1 the same micro-batches are served that many steps in a row. What the
step logs beside the loss (rewards, lengths, timings) is `step_metrics()`, never a batch entry.

A sampler with weights of its own (vLLM, ditty.objectives.rl.samplers) is brought to the policy's
version before it samples; with `rl.max_staleness` > 0 step 2 runs on a sampler thread, ahead of
the training (ditty.objectives.rl.ahead), and the batches in flight are in the checkpoint. Such a
sampler's rollouts also log `rollout/staleness` and the sampler/trainer `rollout/logprob_diff`.

The sampling RNG is seeded from the run seed and the global position of the prompts sampled (inside
`fork_rng`, so the trainer's own RNG is untouched): with the prompt cursor and, mid-reuse, the
buffered rollouts in `state_dict`, a resume after kill -9 samples exactly what the uninterrupted
run sampled, and the same prompts draw the same completions on any world size (when
`rl.generation_batch_size` cuts every rank's prompts alike).
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from ditty.objectives.rewards import reward_metrics
from ditty.objectives.rl.advantages import turn_advantages
from ditty.objectives.rl.ahead import Drawn, SampleAhead
from ditty.objectives.rl.environment import RewardEnvironment
from ditty.objectives.rl.samplers import holds_weights, sync_weights
from ditty.objectives.stream_state import decode_for_rank, encode_by_rank


class RolloutStream:
    def __init__(
        self,
        prompts: Any,
        *,
        sampler: Any,
        environment: Any,
        advantage: Any,
        assembler: Any,
        rl: Any,
        rank: int,
        world_size: int,
    ) -> None:
        self.prompts = prompts
        self.sampler, self.environment, self.advantage, self.assembler = sampler, environment, advantage, assembler
        self.rl = rl
        self.rank, self.world_size = rank, world_size
        # Episodes of several turns are played by their environment, which calls the sampler per turn.
        self.episodes = not isinstance(environment, RewardEnvironment)
        self.buffer: Optional[list[dict]] = None
        self.metrics: dict[str, float] = {}
        self.served = 0
        self.version = 0  # optimizer steps taken: the policy version of the next rollout
        self.last_return: Optional[float] = None  # when the previous next_step handed its batches over
        staleness = getattr(rl, "max_staleness", 0)
        self.ahead = SampleAhead(sampler, self.next_prompts, staleness) if staleness > 0 else None

    # -------------------------------------------------------------- the trainer's stream interface

    @property
    def cursor(self) -> int:
        return self.prompts.cursor

    @property
    def accumulation_steps(self) -> int:
        return len(self.buffer) if self.buffer else 0

    def next_step(self) -> list[dict]:
        started = time.perf_counter()
        train_s = started - self.last_return if self.last_return is not None else None
        if self.buffer is None or self.served >= self.rl.updates_per_rollout:
            self.buffer, self.metrics = self.rollout()
            self.served = 0
            if train_s is not None:
                rollout_s = time.perf_counter() - started
                self.metrics["rollout/generation_share"] = self.metrics["rollout/generate_s"] / (rollout_s + train_s)
        self.served += 1
        self.version += 1
        self.last_return = time.perf_counter()
        return self.buffer

    def step_metrics(self) -> dict[str, float]:
        return dict(self.metrics)

    def source_tokens(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
        for part in (self.prompts, self.sampler):
            close = getattr(part, "close", None)
            if close is not None:
                close()

    def state_dict(self) -> dict[str, Any]:
        """Collective with several ranks: each rank's buffered rollouts are its own."""
        state = {"prompts": self.prompts.state_dict(), "served": self.served, "version": self.version, "buffer": None}
        if self.buffer is not None and self.served < self.rl.updates_per_rollout:  # mid-reuse: keep them
            state["buffer"] = encode_by_rank({"batches": self.buffer, "metrics": self.metrics}, self.world_size)
        if self.ahead is not None:  # the rollouts sampled ahead (waited for)
            state["ahead"] = encode_by_rank(self.ahead.state(), self.world_size)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prompts.load_state_dict(state["prompts"])
        self.served = int(state.get("served", 0))
        self.version = int(state.get("version", 0))
        self.buffer, self.metrics = None, {}
        if state.get("buffer"):
            saved = decode_for_rank(state["buffer"], "buffer", self.rank, self.world_size)
            self.buffer, self.metrics = saved["batches"], saved["metrics"]
        if self.ahead is not None:
            self.ahead.restore(
                decode_for_rank(state["ahead"], "ahead", self.rank, self.world_size) if state.get("ahead") else []
            )

    # -------------------------------------------------------------- one rollout

    def rollout(self) -> tuple[list[dict], dict[str, float]]:
        drawn = self.draw()
        prompt_batch, rollouts, generate_s = drawn.prompts, drawn.rollouts, drawn.generate_s
        group = self.rl.group_size
        if not self.episodes:  # one turn: the reward functions score what the sampler wrote
            prompts = [p for p in prompt_batch["prompts"] for _ in range(group)]
            columns = {k: [v for v in values for _ in range(group)] for k, values in prompt_batch["columns"].items()}
            self.environment.score(rollouts, prompts, columns)
        metrics = self.estimate(rollouts)
        assembled = self.assembler.assemble(rollouts)
        batches = assembled.batches
        tokens = metrics["completions/mean_length"] * len(rollouts) * self.world_size
        metrics["rollout/generate_s"] = generate_s
        metrics["rollout/tokens_per_s"] = tokens / max(_max_across(generate_s, self.world_size), 1e-9)
        if holds_weights(self.sampler) or self.ahead is not None:
            metrics["rollout/staleness"] = float(self.version - rollouts.policy_version)
        if assembled.mismatch is not None:
            metrics.update(mismatch_metrics(assembled.mismatch, self.world_size))
        return batches, metrics

    def next_prompts(self) -> tuple[dict, int]:
        """This rank's prompts of the next step and the global position of the first."""
        step_start = self.prompts.cursor  # global position of the step's first prompt
        (prompt_batch,) = self.prompts.next_step()  # one micro-batch of prompts per rank
        return prompt_batch, step_start + self.rank * len(prompt_batch["prompt_ids"])

    def draw(self) -> Drawn:
        """This step's prompts and their rollouts: sampled now by the policy at this version, or taken
        from the sampler thread (rl.max_staleness > 0)."""
        if self.ahead is not None:
            return self.ahead.next(self.version)
        prompt_batch, first = self.next_prompts()
        started = time.perf_counter()
        sync_weights(self.sampler, self.version)
        if self.episodes:  # several turns: the environment samples each turn and scores the episode
            rollouts = self.environment.run(self.sampler, prompt_batch, first, self.rl.group_size)
        else:
            rollouts = self.sampler.sample(prompt_batch["prompt_ids"], first)
        rollouts.policy_version = self.version
        return Drawn(prompt_batch, rollouts, time.perf_counter() - started)

    def estimate(self, rollouts: Any) -> dict[str, float]:
        """Set `rollouts.advantages` (this rank's rows) from the rewards of the whole global batch;
        the step's reward and completion metrics, over the whole global batch too."""
        totals = _gather(rollouts.rewards.to(torch.float64), self.world_size)
        advantages = self.advantage(totals)
        _require_finite_advantages(advantages.advantages, totals)
        local = len(rollouts)
        rollouts.advantages = advantages.advantages[self.rank * local : (self.rank + 1) * local]
        if self.rl.credit == "turn" and rollouts.turn_rewards is not None:
            rollouts.advantages = turn_advantages(
                rollouts.turn_rewards,
                rollouts.turn_spans,
                [len(ids) for ids in rollouts.completion_ids],
                self.rl.group_size,
                self.rl.scale_rewards,
            )
        gathered = {name: _gather(values, self.world_size) for name, values in rollouts.rewards_per_function.items()}
        lengths = torch.tensor([len(ids) for ids in rollouts.completion_ids], dtype=torch.float64)
        truncated = torch.tensor(rollouts.truncated, dtype=torch.float64)
        all_lengths, all_truncated = _gather(lengths, self.world_size), _gather(truncated, self.world_size)
        metrics = {name: float(value) for name, value in advantages.metrics.items()}
        metrics.update(
            {name: float(value) for name, value in reward_metrics(gathered, rollouts.reward_details).items()}
        )
        for name in names_across(rollouts.episode_metrics, self.world_size):  # every rank logs every name
            values = rollouts.episode_metrics.get(name, torch.zeros(local, dtype=torch.float64))
            metrics[name] = float(_gather(values, self.world_size).mean())
        metrics.update(
            {
                "completions/mean_length": float(all_lengths.mean()),
                "completions/max_length": float(all_lengths.max()),
                "completions/clipped_ratio": float(all_truncated.mean()),
            }
        )
        return metrics


def mismatch_metrics(totals: torch.Tensor, world_size: int) -> dict[str, float]:
    """rollout/logprob_diff/mean and /max over every rank's [sum, tokens, max] (one collective each)."""
    summed, largest = totals[:2].clone(), totals[2:].clone()
    if _distributed(world_size):
        summed, largest = _comm(summed), _comm(largest)
        dist.all_reduce(summed)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    summed, largest = summed.cpu(), largest.cpu()
    return {
        "rollout/logprob_diff/mean": float(summed[0] / summed[1].clamp(min=1)),
        "rollout/logprob_diff/max": float(largest[0]),
    }


def _distributed(world_size: int) -> bool:
    return world_size > 1 and dist.is_available() and dist.is_initialized()


def _comm(t: torch.Tensor) -> torch.Tensor:
    """`t` where the process group can reduce it (NCCL reduces CUDA tensors only)."""
    return t.cuda() if dist.get_backend() == "nccl" else t


def _gather(values: torch.Tensor, world_size: int) -> torch.Tensor:
    """Every rank's `values` (equal lengths), concatenated in rank order (= global prompt order)."""
    if not _distributed(world_size):
        return values
    values = _comm(values.contiguous())
    parts = [torch.empty_like(values) for _ in range(world_size)]
    dist.all_gather(parts, values)
    return torch.cat(parts).cpu()


def names_across(values: dict, world_size: int) -> list[str]:
    """The sorted names of `values` on any rank (an environment may report a metric on one rank only)."""
    names = set(values)
    if _distributed(world_size):
        every: list = [None] * world_size
        dist.all_gather_object(every, sorted(names))
        names = set().union(*every)
    return sorted(names)


def _max_across(value: float, world_size: int) -> float:
    if not _distributed(world_size):
        return value
    t = _comm(torch.tensor([value], dtype=torch.float64))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.cpu())


def _require_finite_advantages(advantages: torch.Tensor, rewards: torch.Tensor) -> None:
    """Finite rewards whose group statistics overflow float64 (each near 1e308) would train on NaN
    advantages, and the run would stop later as 'diverging': name the rewards instead (exit 2)."""
    if bool(torch.isfinite(advantages).all()):
        return
    from ditty.config.errors import RecipeError

    largest = float(rewards.abs().max())
    raise RecipeError.single(
        f"the rewards (up to {largest:.3g} in magnitude) are too large to normalise: their group mean or "
        "spread overflows, which makes the advantages NaN",
        key="rl.rewards",
        fix="scale the reward functions' values down (or their rl.reward_weights)",
    )
