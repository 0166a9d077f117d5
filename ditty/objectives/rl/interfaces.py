"""The interfaces of the parts of on-policy training that a user may write, beside the built-ins.

Every part has one, and a check every built-in passes and a user's part must pass
(ditty.objectives.rl.contracts): `ditty.rl` exports them all.

- `Sampler` (ditty.objectives.sampling.sampler): token ids in, token ids out, seeded by the prompts'
  global positions; `[rollout] backend` chooses the built-in one.
- `Environment` (ditty.objectives.environments.protocol): `reset(row) -> observation`, `step(completion) ->
  StepResult`; `[rl] environment = "package.module:Name"`, with `rl.environment_args`.
- `AdvantageEstimator`: fn(rewards, group_size, lengths) -> advantages; `[rl] advantage`.
- `PolicyLoss`: fn(logps, old_logps, advantages, mask, **counts and settings) -> ObjectiveOutput;
  `[rl] loss`.
- `Assembler` (ditty.objectives.rl.assembler): scored rollouts -> the training micro-batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

    from ditty.objectives.output import Count, ObjectiveOutput
    from ditty.objectives.sampling.batch import RolloutBatch


@runtime_checkable
class AdvantageEstimator(Protocol):
    def __call__(self, rewards: "Tensor", group_size: int, lengths: "Tensor") -> "Tensor":
        """`rewards` [N] float64 of the whole global batch in prompt order, a group's `group_size`
        completions adjacent; `lengths` [N] their token counts. Returns one advantage per completion,
        [N]: the same whichever rank or world size computes it (it sees every rank's rewards)."""


@runtime_checkable
class PolicyLoss(Protocol):
    def __call__(
        self,
        logps: "Tensor",
        old_logps: Optional["Tensor"],
        advantages: "Tensor",
        mask: "Tensor",
        *,
        global_sequences: "Count",
        global_tokens: "Count",
        reference_logps: Optional["Tensor"],
        beta: float,
        clip_low: float,
        clip_high: Optional[float],
        importance: str,
        max_new_tokens: Optional[int],
        token_weights: Optional["Tensor"],
    ) -> "ObjectiveOutput":
        """One micro-batch: the policy's token log-probabilities [B, T] (with gradients), those the
        samples were drawn with (None: this very policy, one update per rollout), the advantages [B]
        (or [B, T] per token), the mask of the tokens that count [B, T], and the WHOLE global batch's
        counts. Returns this micro-batch's SHARE of the global loss (ditty.objectives.output.share)
        and of its metrics, so that any split of a global batch gives the same loss and gradients."""


@runtime_checkable
class Assembler(Protocol):
    def assemble(self, rollouts: "RolloutBatch", drop_idle: bool = True) -> Any:
        """Scored rollouts with their advantages -> this rank's training micro-batches
        (ditty.objectives.rl.assembler.Assembled)."""
