"""One-step-async rollouts (`rollout.max_staleness` > 0): the next steps' rollouts are sampled on a sampler
thread while this step trains.

`next(version)` hands over the oldest rollouts in flight (waiting for them if need be), then tops the
queue up to `rollout.max_staleness` batches sampled ahead, each with the policy as it is now (`version`), so
a batch is at most max_staleness updates older than the policy that trains on it. With 1: step t+1's
rollouts are sampled, with the weights of step t, during step t. The first step has nothing in flight
and samples at once (staleness 0).

What runs where: the prompts are drawn and the weights captured (copied: the step will change the live
ones) on the training thread, in step order, so every rank runs its collectives (FSDP's gather) at the
same point; the sampler thread loads them into the engine and samples. Scoring, advantages and
assembling stay on the training thread (ditty.objectives.rl.stream): they gather across ranks.

A checkpoint waits for the batches in flight and holds them (`state_dict`), so a run killed and resumed
trains on exactly the rollouts the uninterrupted run trained on: they were sampled from the same
prompts, weights and seeds.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from ditty.objectives.sampling.batch import RolloutBatch


@dataclass
class Drawn:
    """A step's prompts (the prompt stream's micro-batch) and the rollouts sampled for them."""

    prompts: dict
    rollouts: RolloutBatch
    generate_s: float
    """Seconds the sampler took (the weights' load included), on whichever thread sampled."""


class SampleAhead:
    """See the module doc. `next_prompts()` -> (this rank's prompt batch of the next step, the global
    position of its first prompt)."""

    def __init__(self, sampler: Any, next_prompts: Callable[[], tuple[dict, int]], depth: int) -> None:
        self.sampler, self.next_prompts, self.depth = sampler, next_prompts, depth
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ditty-rollouts")
        self.pending: deque[Future] = deque()

    def next(self, version: int) -> Drawn:
        if not self.pending:
            self.submit(version)
        drawn = self.pending.popleft().result()  # a sampler's error is raised here, on the training thread
        while len(self.pending) < self.depth:
            self.submit(version)
        return drawn

    def submit(self, version: int) -> None:
        prompts, first = self.next_prompts()
        captured = self.sampler.capture(version, copy=True)
        self.pending.append(self.executor.submit(self.sample, prompts, first, version, captured))

    def sample(self, prompts: dict, first: int, version: int, captured: Any) -> Drawn:
        started = time.perf_counter()
        if captured is not None:
            self.sampler.load(captured)
        rollouts = self.sampler.sample(prompts["prompt_ids"], first)
        rollouts.policy_version = version
        return Drawn(prompts, rollouts, time.perf_counter() - started)

    def state(self) -> list[Drawn]:
        """The batches in flight, once sampled (a checkpoint waits for them)."""
        return [future.result() for future in self.pending]

    def restore(self, drawn: list[Drawn]) -> None:
        self.pending.clear()
        for item in drawn:
            done: Future = Future()
            done.set_result(item)
            self.pending.append(done)

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
