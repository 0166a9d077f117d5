"""The rollout stream: GRPO's data. It wraps the stream of prompts and hands the trainer micro-batches
of scored completions, so the trainer's loop (`train_step(stream.next_step())`) is unchanged.

One `next_step()` on each rank:
1. takes this rank's prompts of the step from the prompt stream (global_batch_size / group_size
   prompts per step, the same global order and cursor as every format; whole groups per rank);
2. samples `group_size` completions of each on the live policy (the adapter on, under LoRA) through
   `ditty.train.rl.generation` (one `generate` call, or `rl.generation_batch_size` prompts at a
   time; each prompt's KV cache computed once and repeated for its group);
3. scores them with the reward functions (a failing function stops the run, exit 2, before any
   update), gathers every rank's rewards in global prompt order and turns them into group
   advantages, of which the rank keeps its own;
4. computes the log-probabilities the completions were sampled with (only when
   updates_per_rollout > 1) and the reference's (only when beta > 0);
5. cuts the completions into micro-batches: prompt + completion rows, right-padded, labels on the
   completion tokens (its end-of-sequence token included), with the advantages and flags; with
   beta 0 the rows of advantage 0 (groups whose completions all scored alike) are left out, as
   their loss and gradient are exactly 0, so the step's forward and backward skip them.
With `updates_per_rollout` > 1 the same micro-batches are served that many steps in a row.

The sampling RNG is seeded from the run seed and the global position of the prompts sampled (inside
`fork_rng`, so the trainer's own RNG is untouched): with the prompt cursor and, mid-reuse, the
buffered rollouts in `state_dict`, a resume after kill -9 samples exactly what the uninterrupted
run sampled, and the same prompts draw the same completions on any world size (when
`rl.generation_batch_size` cuts every rank's prompts alike).
"""

from __future__ import annotations

import base64
import io
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ditty._utils.labels import IGNORE_INDEX
from ditty.objectives.grpo import group_advantages
from ditty.objectives.rewards import RewardFunction, reward_metrics, score_completions
from ditty.train.rl.generation import generate_groups


@dataclass
class Completions:
    """The sampled completions of one rank's prompts: row i is completion i % group_size of prompt
    i // group_size."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    """Generated tokens up to and including the first end-of-sequence token (none when truncated)."""
    texts: list[str]
    truncated: list[bool]


class RolloutStream:
    """See the module doc. `policy()` gives the model to sample from (unwrapped, adapter on);
    `logps(model_or_none, batch)` the token log-probabilities of a micro-batch under the policy
    (None) or the reference."""

    def __init__(
        self,
        prompts: Any,
        *,
        rl: Any,
        reward_functions: list[RewardFunction],
        tokenizer: Any,
        policy: Callable[[], torch.nn.Module],
        logps: Callable[[str, dict], torch.Tensor],
        micro_batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        self.prompts = prompts
        self.rl = rl
        self.reward_functions = reward_functions
        self.tokenizer = tokenizer
        self.policy = policy
        self.logps = logps
        self.micro_batch_size = micro_batch_size
        self.rank, self.world_size, self.device = rank, world_size, device
        self.seed = seed
        self.buffer: Optional[list[dict]] = None
        self.served = 0
        self.last_return: Optional[float] = None  # when the previous next_step handed its batches over

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
            self.buffer = self.rollout()
            self.served = 0
            rollout_s = time.perf_counter() - started
            generate_s = self.buffer[0]["rollout_metrics"]["rollout/generate_s"]
            for batch in self.buffer:  # the same global values on every micro-batch and rank
                metrics = batch["rollout_metrics"]
                if train_s is not None:
                    metrics["rollout/generation_share"] = generate_s / (rollout_s + train_s)
        self.served += 1
        self.last_return = time.perf_counter()
        return self.buffer

    def source_tokens(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        close = getattr(self.prompts, "close", None)
        if close is not None:
            close()

    def state_dict(self) -> dict[str, Any]:
        state = {
            "prompts": self.prompts.state_dict(),
            "served": self.served,
            "buffer": None,
        }
        if self.buffer is not None and self.served < self.rl.updates_per_rollout:  # mid-reuse: keep them
            state["buffer"] = _encode(self.buffer)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prompts.load_state_dict(state["prompts"])
        self.served = int(state.get("served", 0))
        self.buffer = _decode(state["buffer"]) if state.get("buffer") else None

    # -------------------------------------------------------------- one rollout

    def rollout(self) -> list[dict]:
        step_start = self.prompts.cursor  # global position of the step's first prompt
        (prompt_batch,) = self.prompts.next_step()  # one micro-batch of prompts per rank (ditty.train.rl)
        group = self.rl.group_size
        started = time.perf_counter()
        first = step_start + self.rank * len(prompt_batch["prompt_ids"])
        done = self.sample(prompt_batch["prompt_ids"], first)
        generate_s = time.perf_counter() - started
        prompts = [p for p in prompt_batch["prompts"] for _ in range(group)]
        columns = {name: [v for v in values for _ in range(group)] for name, values in prompt_batch["columns"].items()}
        scores = score_completions(
            self.reward_functions, prompts, done.texts, columns, timeout_s=self.rl.reward_timeout_s
        )
        batches = self.assemble(done, scores.total, scores.per_function, scores.details)
        metrics = batches[0]["rollout_metrics"]
        tokens = metrics["completions/mean_length"] * batches[0]["global_sequences"]
        timing = {
            "rollout/generate_s": generate_s,
            "rollout/tokens_per_s": tokens / max(_max_across(generate_s, self.world_size), 1e-9),
        }
        for batch in batches:
            batch["rollout_metrics"].update(timing)
        return batches

    def assemble(
        self,
        done: Completions,
        rewards: torch.Tensor,
        per_function: Optional[dict[str, torch.Tensor]] = None,
        details: Optional[dict[str, torch.Tensor]] = None,
        drop_idle: bool = True,
    ) -> list[dict]:
        """This rank's micro-batches of scored completions: `rewards` [local completions] gathered in
        global order into group advantages, the global counts the loss and its metrics divide by,
        the rollout metrics, and the old and reference log-probabilities where needed.

        `drop_idle` (with beta 0): the rows whose advantage is 0 (every row of a group whose
        completions scored alike) are left out of the micro-batches. Their loss and gradient are
        exactly 0, so the step is the same, but the forward and backward skip them; each micro-batch
        keeps its share of the loss's denominator (`sequence_count`, `token_count`) as if they were
        there, and at least one row, so every rank still runs the same forwards."""
        totals = _gather(rewards.to(torch.float64), self.world_size)
        advantages = group_advantages(totals, self.rl.group_size, self.rl.scale_rewards)
        local = len(done.texts)
        mine = advantages.advantages[self.rank * local : (self.rank + 1) * local]
        gathered = {name: _gather(values, self.world_size) for name, values in (per_function or {}).items()}
        lengths = torch.tensor([len(ids) for ids in done.completion_ids], dtype=torch.float64)
        truncated = torch.tensor(done.truncated, dtype=torch.bool)
        all_lengths, all_truncated = _gather(lengths, self.world_size), _gather(truncated.double(), self.world_size)
        metrics = {name: float(value) for name, value in advantages.metrics.items()}
        metrics.update({name: float(value) for name, value in reward_metrics(gathered, details).items()})
        metrics.update(
            {
                "completions/mean_length": float(all_lengths.mean()),
                "completions/max_length": float(all_lengths.max()),
                "completions/clipped_ratio": float(all_truncated.mean()),
            }
        )
        batches = self.micro_batches(done, mine, truncated)
        global_tokens = _sum_across(float(sum(self.scored_tokens(b) for b in batches)), self.world_size)
        scale = float(len(batches) * self.world_size)  # the trainer averages loss metrics over both
        for batch in batches:
            batch.update(
                global_sequences=float(len(totals)),
                global_tokens=max(global_tokens, 1.0),
                metric_scale=scale,
                sequence_count=torch.tensor(len(batch["advantages"])),
                token_count=torch.tensor(self.scored_tokens(batch)),
                rollout_metrics=dict(metrics),
            )
        if drop_idle and self.rl.beta == 0:
            batches = [without_idle_rows(batch) for batch in batches]
        self.add_logps(batches)
        return batches

    def scored_tokens(self, batch: dict) -> int:
        """Completion tokens of a micro-batch that take part in the loss (rl.mask_truncated drops
        the truncated completions' tokens)."""
        scored = batch["labels"][:, 1:] != IGNORE_INDEX
        if self.rl.mask_truncated:
            scored = scored & ~batch["truncated"][:, None]
        return int(scored.sum())

    @torch.no_grad()
    def sample(self, prompt_ids: list[list[int]], first_position: int = 0) -> Completions:
        """`group_size` completions of every prompt, `rl.generation_batch_size` prompts per call;
        `first_position`: the first prompt's place in the global order (it seeds the sampling)."""
        tokenizer = self.tokenizer
        eos = tokenizer.eos_token_id
        out = Completions([], [], [], [])
        for prompts, generated in generate_groups(
            self.policy(), prompt_ids, self.rl, tokenizer, self.device, self.seed, first_position
        ):
            for ids, row in zip([ids for ids in prompts for _ in range(self.rl.group_size)], generated):
                ended = eos is not None and eos in row
                completion = row[: row.index(eos) + 1] if ended else row
                text_ids = completion[:-1] if ended else completion
                out.prompt_ids.append(list(ids))
                out.completion_ids.append(completion)
                out.texts.append(tokenizer.decode(text_ids, skip_special_tokens=True))
                out.truncated.append(not ended)
        return out

    def micro_batches(self, done: Completions, advantages: torch.Tensor, truncated: torch.Tensor) -> list[dict]:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        batches = []
        for start in range(0, len(done.texts), self.micro_batch_size):
            rows = range(start, min(start + self.micro_batch_size, len(done.texts)))
            seqs = [done.prompt_ids[i] + done.completion_ids[i] for i in rows]
            width = max(len(s) for s in seqs)
            input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
            labels = torch.full((len(seqs), width), IGNORE_INDEX, dtype=torch.long)
            attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for row, i in enumerate(rows):
                prompt, completion = done.prompt_ids[i], done.completion_ids[i]
                input_ids[row, : len(seqs[row])] = torch.tensor(seqs[row])
                labels[row, len(prompt) : len(seqs[row])] = torch.tensor(completion)
                attention_mask[row, : len(seqs[row])] = 1
            batches.append(
                {
                    "input_ids": input_ids,
                    "attention_mask": attention_mask,
                    "labels": labels,
                    "advantages": advantages[start : start + len(seqs)].to(torch.float32),
                    "truncated": truncated[start : start + len(seqs)],
                }
            )
        return batches

    def add_logps(self, batches: list[dict]) -> None:
        """The sampling policy's log-probabilities (reused rollouts) and the reference's (beta > 0)."""
        for batch in batches:
            if self.rl.updates_per_rollout > 1:
                batch["old_logps"] = self.logps("policy", batch).cpu()
            if self.rl.beta > 0:
                batch["ref_logps"] = self.logps("reference", batch).cpu()


def without_idle_rows(batch: dict) -> dict:
    """The micro-batch without its rows of advantage 0 (at least one row kept), cut to the width of
    the longest row left; every other entry unchanged."""
    keep = torch.nonzero(batch["advantages"] != 0).flatten()
    if len(keep) == len(batch["advantages"]):
        return batch
    if len(keep) == 0:
        keep = torch.zeros(1, dtype=torch.long)
    width = int(batch["attention_mask"][keep].sum(-1).max())
    out = dict(batch)
    for key in ("input_ids", "attention_mask", "labels"):
        out[key] = batch[key][keep, :width]
    for key in ("advantages", "truncated"):
        out[key] = batch[key][keep]
    return out


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


def _reduce(value: float, world_size: int, op: Any = None) -> float:
    if not _distributed(world_size):
        return value
    t = _comm(torch.tensor([value], dtype=torch.float64))
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return float(t.cpu())


def _sum_across(value: float, world_size: int) -> float:
    return _reduce(value, world_size)


def _max_across(value: float, world_size: int) -> float:
    return _reduce(value, world_size, dist.ReduceOp.MAX)


def _encode(value: Any) -> str:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _decode(text: str) -> Any:
    return torch.load(io.BytesIO(base64.b64decode(text)), weights_only=False)
