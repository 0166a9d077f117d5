"""The rollout stream: the RL rows' micro-batches, made from the stream of prompts by the RL parts.

One `next_step()` on each rank:
1. takes this rank's prompts of the step from the prompt stream (global_batch_size / group_size
   prompts per step, the same global order and cursor as every format; whole groups per rank);
2. the environment plays `group_size` episodes of each through the policy's sampling
   (ditty.objectives.sampling.policy_sampling: the sampler at the policy's version): one completion scored by
   the reward functions, or episodes of several turns (ditty.objectives.environments.protocol; a failing
   reward function or environment stops the run, exit 2, before any update);
   with `rl.guidance_column`, a group that sampled nothing as good as the prompt row's answer gets that
   answer in place of its last completion (ditty.objectives.rl.guidance);
3. (rollout/generate_s times the sampling);
4. every rank's rewards are gathered in global prompt order and the advantage estimator turns them
   into advantages (ditty.objectives.rl.turn_credit), of which the rank keeps its own;
5. the assembler cuts the rollouts into micro-batches (ditty.objectives.rl.assembler).
With `updates_per_rollout` > 1 the same micro-batches are served that many steps in a row. What the
step logs beside the loss (rewards, lengths, timings) is `step_metrics()`, never a batch entry.

With `rollout.max_staleness` > 0 step 2's sampling runs on a sampler thread, ahead of the training,
and the environment scores those completions when their step comes; the batches in flight are in
the checkpoint. A sampler with weights of its own (vLLM) or sampling ahead also logs
`rollout/staleness` (in optimizer updates) and the sampler/trainer `rollout/logprob_diff`.

The sampling RNG is seeded from the run seed and the global position of the prompts sampled (inside
`fork_rng`, so the trainer's own RNG is untouched): with the prompt cursor and, mid-reuse, the
buffered rollouts in `state_dict`, a resume after kill -9 samples exactly what the uninterrupted
run sampled, and the same prompts draw the same completions on any world size (when
`rollout.generation_batch_size` cuts every rank's prompts alike).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from ditty.config.rollout import RolloutConfig
from ditty.objectives.rewards.functions import reward_metrics
from ditty.objectives.rl.budgets import BudgetWatch
from ditty.objectives.rl.turn_credit import turn_advantages
from ditty.objectives.sampling.ahead import Drawn
from ditty.objectives.sampling.stream_state import decode_for_rank, encode_by_rank

log = logging.getLogger("ditty.train")


class RolloutStream:
    def __init__(
        self,
        prompts: Any,
        *,
        sampling: Any,
        environment: Any,
        advantage: Any,
        assembler: Any,
        rl: Any,
        rank: int,
        world_size: int,
        rollout: Any = None,
        group: Any = None,
        guidance: Any = None,
    ) -> None:
        """`sampling`: the policy's (ditty.objectives.sampling.policy_sampling.PolicySampling);
        `rollout`: the recipe's RolloutConfig (its budgets, named in a warning; defaults when None).
        `rank`, `world_size`: this rank's place among the ranks that take different prompts (the
        data-parallel ones: under tensor parallel a tp group shares its prompts and samples alike);
        `group`: their process group (None: the whole world); `guidance`: the data's answers put in
        groups that sampled none as good (ditty.objectives.rl.guidance.Guidance; None: off)."""
        self.prompts = prompts
        self.sampling, self.environment, self.advantage, self.assembler = sampling, environment, advantage, assembler
        self.rl = rl
        self.rank, self.world_size, self.group = rank, world_size, group
        self.guidance = guidance
        self.budgets = BudgetWatch(rl, rollout if rollout is not None else RolloutConfig())
        self.buffer: Optional[list[dict]] = None
        self.metrics: dict[str, float] = {}
        self.served = 0
        self.last_return: Optional[float] = None  # when the previous next_step handed its batches over
        if sampling.max_staleness > 0:
            sampling.sample_ahead(self.next_prompts)

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
        self.last_return = time.perf_counter()
        return self.buffer

    def step_metrics(self) -> dict[str, float]:
        return dict(self.metrics)

    def source_tokens(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        self.sampling.close()
        self.prompts.close()

    def state_dict(self) -> dict[str, Any]:
        """Collective with several ranks: each rank's buffered rollouts are its own."""
        ahead = self.sampling.ahead
        version = self.sampling.version
        state = {"prompts": self.prompts.state_dict(), "served": self.served, "version": version, "buffer": None}
        if self.buffer is not None and self.served < self.rl.updates_per_rollout:  # mid-reuse: keep them
            state["buffer"] = encode_by_rank(
                {"batches": self.buffer, "metrics": self.metrics}, self.world_size, self.group
            )
        if ahead is not None:  # the rollouts sampled ahead (waited for)
            state["ahead"] = encode_by_rank(ahead.state(), self.world_size, self.group)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prompts.load_state_dict(state["prompts"])
        self.served = int(state.get("served", 0))
        self.sampling.version = int(state.get("version", 0))
        self.buffer, self.metrics = None, {}
        if state.get("buffer"):
            saved = decode_for_rank(state["buffer"], "buffer", self.rank, self.world_size)
            self.buffer, self.metrics = saved["batches"], saved["metrics"]
        if self.sampling.ahead is not None:
            self.sampling.ahead.restore(
                decode_for_rank(state["ahead"], "ahead", self.rank, self.world_size) if state.get("ahead") else []
            )

    # -------------------------------------------------------------- one rollout

    def rollout(self) -> tuple[list[dict], dict[str, float]]:
        drawn = self.draw()
        rollouts, generate_s = drawn.rollouts, drawn.generate_s
        metrics = self.estimate(rollouts)
        warning = self.budgets.observe(metrics)  # the same global metrics on every rank
        if warning is not None and self.rank == 0:
            log.warning(warning)
        assembled = self.assembler.assemble(rollouts)
        batches = assembled.batches
        tokens = metrics["completions/mean_length"] * len(rollouts) * self.world_size
        metrics["rollout/generate_s"] = generate_s
        metrics["rollout/tokens_per_s"] = tokens / max(_max_across(generate_s, self.world_size, self.group), 1e-9)
        if self.sampling.holds_weights or self.sampling.ahead is not None:
            metrics["rollout/staleness"] = float(self.sampling.version - rollouts.policy_version)
        if assembled.mismatch is not None:
            metrics.update(mismatch_metrics(assembled.mismatch, self.world_size, self.group))
        return batches, metrics

    def next_prompts(self) -> tuple[dict, int]:
        """This rank's prompts of the next step and the global position of the first."""
        step_start = self.prompts.cursor  # global position of the step's first prompt
        (prompt_batch,) = self.prompts.next_step()  # one micro-batch of prompts per rank
        return prompt_batch, step_start + self.rank * len(prompt_batch["prompt_ids"])

    def draw(self) -> Drawn:
        """This step's prompts and their scored rollouts: played now through the policy's sampling at
        this version, or taken from the sampler thread (rollout.max_staleness > 0) and scored here."""
        group = self.rl.group_size
        if self.sampling.ahead is not None:
            drawn = self.sampling.draw_ahead()
            self.environment.score_drawn(drawn.rollouts, drawn.prompts, group)
        else:
            prompt_batch, first = self.next_prompts()
            started = time.perf_counter()
            rollouts = self.environment.run(self.sampling, prompt_batch, first, group)
            rollouts.policy_version = self.sampling.version
            drawn = Drawn(prompt_batch, rollouts, time.perf_counter() - started)
        if self.guidance is not None:
            self.guidance.apply(drawn.rollouts, drawn.prompts, group)
        return drawn

    def estimate(self, rollouts: Any) -> dict[str, float]:
        """Set `rollouts.advantages` (this rank's rows) from the rewards of the whole global batch;
        the step's reward and completion metrics, over the whole global batch too."""
        totals = _gather(rollouts.rewards.to(torch.float64), self.world_size, self.group)
        lengths = torch.tensor([len(ids) for ids in rollouts.completion_ids], dtype=torch.float64)
        all_lengths = _gather(lengths, self.world_size, self.group)
        advantages = checked_advantages(self.advantage(totals, self.rl.group_size, all_lengths), totals)
        local = len(rollouts)
        rollouts.advantages = advantages[self.rank * local : (self.rank + 1) * local]
        if self.rl.credit == "turn" and rollouts.turn_rewards is not None:
            rollouts.advantages = turn_advantages(
                rollouts.turn_rewards,
                rollouts.turn_spans,
                [len(ids) for ids in rollouts.completion_ids],
                self.rl.group_size,
                self.rl.scale_rewards,
            )
        scale = self.rl.negative_advantage_scale
        if scale != 1.0:
            rollouts.advantages = torch.where(rollouts.advantages < 0, rollouts.advantages * scale, rollouts.advantages)
        gathered = {
            name: _gather(values, self.world_size, self.group) for name, values in rollouts.rewards_per_function.items()
        }
        truncated = torch.tensor(rollouts.truncated, dtype=torch.float64)
        all_truncated = _gather(truncated, self.world_size, self.group)
        metrics = {name: float(value) for name, value in reward_statistics(totals, self.rl.group_size).items()}
        metrics.update(
            {name: float(value) for name, value in reward_metrics(gathered, rollouts.reward_details).items()}
        )
        for name in names_across(rollouts.episode_metrics, self.world_size, self.group):  # every rank logs every name
            values = rollouts.episode_metrics.get(name, torch.zeros(local, dtype=torch.float64))
            metrics[name] = float(_gather(values, self.world_size, self.group).mean())
        if rollouts.guided is not None:
            guided = _gather(torch.tensor(rollouts.guided, dtype=torch.float64), self.world_size, self.group)
            metrics["rollout/guided_share"] = float(guided.sum()) / (len(guided) // self.rl.group_size)
            metrics["rollout/sampled_reward"] = float(totals[guided == 0].mean())
        metrics.update(
            {
                "completions/mean_length": float(all_lengths.mean()),
                "completions/max_length": float(all_lengths.max()),
                "completions/clipped_ratio": float(all_truncated.mean()),
            }
        )
        return metrics


def mismatch_metrics(totals: torch.Tensor, world_size: int, group: Any = None) -> dict[str, float]:
    """rollout/logprob_diff/mean and /max over every rank's [sum, tokens, max] (one collective each)."""
    summed, largest = totals[:2].clone(), totals[2:].clone()
    if _distributed(world_size):
        summed, largest = _comm(summed), _comm(largest)
        dist.all_reduce(summed, group=group)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
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


def _gather(values: torch.Tensor, world_size: int, group: Any = None) -> torch.Tensor:
    """Every rank's `values` (equal lengths), concatenated in rank order (= global prompt order)."""
    if not _distributed(world_size):
        return values
    values = _comm(values.contiguous())
    parts = [torch.empty_like(values) for _ in range(world_size)]
    dist.all_gather(parts, values, group=group)
    return torch.cat(parts).cpu()


def names_across(values: dict, world_size: int, group: Any = None) -> list[str]:
    """The sorted names of `values` on any rank (an environment may report a metric on one rank only)."""
    names = set(values)
    if _distributed(world_size):
        every: list = [None] * world_size
        dist.all_gather_object(every, sorted(names), group=group)
        names = set().union(*every)
    return sorted(names)


def _max_across(value: float, world_size: int, group: Any = None) -> float:
    if not _distributed(world_size):
        return value
    t = _comm(torch.tensor([value], dtype=torch.float64))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.cpu())


def reward_statistics(rewards: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """reward, reward_std and frac_reward_zero_std of the whole batch's rewards, whatever the estimator."""
    from ditty.objectives.rl.grpo import group_advantages

    return group_advantages(rewards, group_size, "none").metrics


def checked_advantages(advantages: Any, rewards: torch.Tensor) -> torch.Tensor:
    """The estimator's advantages as [N] float64, one per reward; an estimator that answers otherwise
    (a user's, named by rl.advantage) stops the run with exit 2 naming it. Finite rewards whose group
    statistics overflow float64 (each near 1e308) would train on NaN advantages, and the run would
    stop later as 'diverging': the rewards are named instead (exit 2)."""
    from ditty.config.errors import RecipeError

    if not isinstance(advantages, torch.Tensor) or tuple(advantages.shape) != tuple(rewards.shape):
        got = tuple(advantages.shape) if isinstance(advantages, torch.Tensor) else type(advantages).__name__
        raise RecipeError.single(
            f"the advantage estimator returned {got} for {tuple(rewards.shape)} rewards",
            key="rl.advantage",
            fix="return a tensor of one advantage per reward (ditty.rl.AdvantageEstimator)",
        )
    advantages = advantages.to(torch.float64)
    if bool(torch.isfinite(advantages).all()):
        return advantages
    largest = float(rewards.abs().max())
    if largest < 1e150:  # rewards this size normalise: the estimator made the NaN
        raise RecipeError.single(
            "the advantage estimator returned non-finite advantages for finite rewards",
            key="rl.advantage",
            fix="check the estimator (a group whose rewards all agree has a spread of 0)",
        )
    raise RecipeError.single(
        f"the rewards (up to {largest:.3g} in magnitude) are too large to normalise: their group mean or "
        "spread overflows, which makes the advantages NaN",
        key="rl.rewards",
        fix="scale the reward functions' values down (or their rl.reward_weights)",
    )
