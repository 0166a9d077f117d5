"""How every on-policy row samples from the policy it trains: GRPO and RLOO, online preference pairs and
on-policy distillation each hold one `PolicySampling` around the sampler `[rollout]` chooses
(ditty.objectives.sampling.sampler), and sample through it.

- Versions: `version` counts the optimizer updates the policy has taken. The trainer reports each
  update that changed the weights (`updated()`, through the row's `ObjectiveParts.after_update`); a
  step skipped as non-finite changed nothing and counts nothing. Samples carry the version they were
  drawn at (`RolloutBatch.policy_version`), so `rollout/staleness` is in updates.
- Weights: a sampler with weights of its own (a vLLM engine or server) is brought to the policy's
  version before it samples (`sync_weights`); a sampler of the live policy (`generate`) needs nothing.
- Ahead (`rollout.max_staleness = k` > 0): `ahead(next_request)` keeps up to k draws in flight on a
  sampler thread (ditty.objectives.sampling.ahead), each sampled with the weights of the update it was
  submitted at, so a step trains on samples at most k updates old.

A `PolicySampling` is itself a `Sampler`: an environment that plays episodes calls it turn by turn,
and it keeps the sampler at the policy's version for each call. Seeding by the prompts' global
positions is the samplers' own.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ditty.objectives.sampling.batch import RolloutBatch
from ditty.objectives.sampling.sampler import Sampler, TurnOutput, sync_weights


class PolicySampling(Sampler):
    def __init__(self, sampler: Sampler, *, max_staleness: int = 0) -> None:
        self.sampler, self.max_staleness = sampler, max_staleness
        self.version = 0
        self.ahead: Optional[Any] = None

    @property
    def holds_weights(self) -> bool:  # type: ignore[override]
        return self.sampler.holds_weights

    def updated(self) -> None:
        """The optimizer changed the policy's weights: the next samples are drawn at a newer version."""
        self.version += 1

    # -------------------------------------------------------------- sampling now, at the policy's version

    def sample(
        self, prompt_ids: list[list[int]], first_position: int = 0, max_new_tokens: Optional[int] = None
    ) -> RolloutBatch:
        sync_weights(self.sampler, self.version)
        rollouts = self.sampler.sample(prompt_ids, first_position, max_new_tokens)
        rollouts.policy_version = self.version
        return rollouts

    def generate_turn(self, turn: Any) -> TurnOutput:
        sync_weights(self.sampler, self.version)
        return self.sampler.generate_turn(turn)

    # -------------------------------------------------------------- sampling ahead

    def sample_ahead(self, next_request: Callable[[], tuple[dict, int]]) -> None:
        """From now on `draw_ahead()` hands over samples drawn up to `max_staleness` updates ahead;
        `next_request()` -> (the next step's prompt batch, the global position of its first prompt)."""
        from ditty.objectives.sampling.ahead import SampleAhead

        self.ahead = SampleAhead(self.sampler, next_request, self.max_staleness)

    def draw_ahead(self) -> Any:
        """The oldest draw in flight (ditty.objectives.sampling.ahead.Drawn), the queue topped up at this version."""
        return self.ahead.next(self.version)

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
        self.sampler.close()
