"""`RolloutBatch`: what the RL parts pass between them (ditty.objectives.rl).

The sampler fills the token ids (and may give its own log-probabilities; with an environment of
several turns, the environment's part of them is not `trainable`), the environment the rewards, the
advantage estimator the advantages; the assembler turns it into the training micro-batches. It is
one rank's rollouts of one step: row i is completion i % group_size of prompt i // group_size, and
every field is in that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch import Tensor


@dataclass
class RolloutBatch:
    prompt_ids: list[list[int]]
    """The prompt tokens of each row (a group's rows share them)."""
    completion_ids: list[list[int]]
    """The tokens after the prompt, up to and including the first end-of-sequence token (none when
    the completion was cut at max_new_tokens)."""
    texts: list[str]
    """The completions' text, as the environment scores it (special tokens left out)."""
    truncated: list[bool]
    """Cut at max_new_tokens before an end of sequence."""
    trainable: Optional[list[list[bool]]] = None
    """Per completion token: written by the model (True, it trains) or by the environment (False: a tool's
    output, for instance); None: every completion token is the model's."""
    sampler_logps: Optional[list[list[float]]] = None
    """Per completion token, the log-probability the sampler drew it with, when the sampler reports it."""
    policy_version: int = 0
    """Optimizer steps the sampling weights had taken (0: the starting weights)."""
    rewards: Optional[Tensor] = None
    """[rows] float64, the weighted sum of the reward functions (set by the environment)."""
    rewards_per_function: dict[str, Tensor] = field(default_factory=dict)
    """Each function's [rows] rewards, before weighting."""
    reward_details: dict[str, Tensor] = field(default_factory=dict)
    """Extra values the functions reported (rewards/NAME/METRIC), [rows] each."""
    advantages: Optional[Tensor] = None
    """[rows] (set by the advantage estimator): this rank's rows of the global batch's advantages;
    [rows, completion width] per token with `rl.credit = "turn"`."""
    turn_spans: Optional[list[list[tuple[int, int]]]] = None
    """Episodes of several turns: [start, end) of each model turn in the row's completion_ids."""
    turn_rewards: Optional[list[list[float]]] = None
    """Episodes of several turns: each model turn's reward (the final answer's score in the last)."""
    guided: Optional[list[bool]] = None
    """Rows holding the data's answer in place of a sampled completion (ditty.objectives.rl.guidance);
    None: every row was sampled."""
    episode_metrics: dict[str, Tensor] = field(default_factory=dict)
    """Per row ([rows] float64 each): env/turns, env/episode_tokens, env/truncated,
    env/observations_cut and the environment's own metrics (env/NAME); empty for one-turn rollouts."""

    def __len__(self) -> int:
        return len(self.completion_ids)
