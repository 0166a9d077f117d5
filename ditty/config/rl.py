"""`[rl]`: reinforcement learning with verifiable rewards (GRPO and its variants).

Defaults are TRL's GRPOConfig's where TRL has one (num_generations -> group_size,
epsilon/epsilon_high -> clip_low/clip_high, num_iterations -> updates_per_rollout,
importance_sampling_level -> importance, loss_type -> loss, mask_truncated_completions ->
mask_truncated). `train.global_batch_size` counts completions, as TRL's generation batch: each step
samples global_batch_size / group_size prompts. How the completions are sampled (the engine,
temperature, max_new_tokens, ...) is `[rollout]`'s, shared with the other on-policy rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional


@dataclass(frozen=True)
class RLConfig:
    kind: Literal["none", "grpo"] = "none"
    """"grpo": sample `group_size` completions per prompt with the live policy, score them with the
    reward functions, and train the clipped policy loss on their advantages (needs data.format = "prompt")."""
    advantage: str = "group"
    """How a completion's reward becomes its advantage (ditty.objectives.rl.estimators): "group"
    normalises it by its group's mean (and std, see scale_rewards: GRPO); "rloo" subtracts the mean of
    the OTHER completions of its prompt (the leave-one-out baseline of RLOO, Ahmadian et al. 2024;
    TRL's RLOOTrainer); "reinforce_pp" subtracts the group's mean, then whitens over the batch's tokens
    (REINFORCE++ with a group baseline, verl's reinforce_plus_plus_baseline); or your own function as
    "package.module:function", fn(rewards, group_size, lengths) -> advantages (ditty.rl.AdvantageEstimator)."""
    group_size: int = 8
    """Completions sampled per prompt (TRL: num_generations)."""
    loss: str = "dapo"
    """The policy loss (ditty.objectives.rl.policy_losses): the clipped surrogate normalised "grpo" per
    sequence then over sequences, "dapo" per token of the global batch, "dr_grpo" by sequences x
    rollout.max_new_tokens (TRL: loss_type); or your own function as "package.module:function" with
    grpo_loss's arguments, returning its micro-batch's share of the loss (ditty.rl.PolicyLoss)."""
    clip_low: float = 0.2
    """Lower clip of the importance ratio, 1 - clip_low (TRL: epsilon)."""
    clip_high: Optional[float] = None
    """Upper clip, 1 + clip_high; unset: clip_low (DAPO's clip-higher uses 0.28; TRL: epsilon_high)."""
    importance: Literal["token", "sequence"] = "token"
    """Importance ratio per token, or GSPO's per sequence (TRL: importance_sampling_level)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide the centred rewards by the std of their group, of the whole batch, or not at all (Dr. GRPO)."""
    negative_advantage_scale: float = 1.0
    """Multiplies every negative advantage: 1 is the estimator's own; 0 trains on the completions that
    scored above their group's mean alone (positive-sample reinforcement, Zhu et al. 2025), so a policy
    that samples mostly wrong answers is pulled towards its right ones without being pushed off them."""
    beta: float = 0.0
    """Weight of the k3 KL estimate to the reference model; 0 loads no reference. With an adapter the
    reference is the base model with the adapter disabled, otherwise a frozen copy of the start."""
    updates_per_rollout: int = 1
    """Optimizer steps on each batch of rollouts (TRL: num_iterations); above 1 the importance ratios
    are taken against the log-probabilities the rollouts were sampled with."""
    mask_truncated: bool = False
    """Completions cut at max_new_tokens take no gradient (TRL: mask_truncated_completions)."""
    rewards: list[str] = field(default_factory=list)
    """Reward functions as "package.module:function", each fn(prompts, completions, **columns) ->
    list[float] (TRL's signature); e.g. "ditty.objectives.rewards.builtin_rewards:exact_match"."""
    guidance_column: str = ""
    """A prompt column holding each prompt's right answer (the built-in datasets' "completion"): a group
    whose completions all score below that answer gets it in place of its last completion, scored by
    the same reward functions, so a policy that samples no right answer still has one to learn from
    (off-policy guidance, LUFFY; ditty.objectives.rl.guidance). Unset: every completion is sampled."""
    reward_weights: Optional[list[float]] = None
    """One weight per reward function; unset: every weight 1.0."""
    reward_timeout_s: float = 600.0
    """Seconds one reward function may take on one batch of completions; a function still running
    then stops the run (exit code 2, the last checkpoint intact). 0: no limit. A function that calls
    os._exit() ends the process at once: that cannot be caught in-process."""
    environment: str = ""
    """The environment episodes run in, as "package.module:Name": a class with `reset(row) ->
    observation` (the first messages, from the prompt row) and `step(completion) -> StepResult` (the
    next observation, a reward, done, metrics; ditty.objectives.environments.protocol). Unset: the built-in
    tool environment when `tools` are named, else one turn scored by the reward functions."""
    environment_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments the `environment` class is built with, once per episode (a TOML table:
    `environment_args = { highest = 20 }`); the compiler checks them against its constructor."""
    tools: list[str] = field(default_factory=list)
    """Python functions the model may call, as "package.module:function" (the built-in tool
    environment: a `<tool_call>{json}</tool_call>` in the chat template's format calls one, its
    result comes back as a `tool` message); the reward functions score the episode's final answer."""
    max_turns: int = 4
    """Most model turns in one episode of an environment; an episode still open after them is truncated."""
    max_episode_tokens: int = 1024
    """Most tokens an episode adds after its prompt (the model's and the environment's together);
    an episode that reaches it is cut there and counted as truncated."""
    tool_timeout_s: float = 10.0
    """Seconds a tool call may take; a call still running then is answered with an error message."""
    tools_isolation: Literal["process", "thread"] = "process"
    """Where the tools run: "process", in a worker process that a tool calling os._exit(), crashing or
    hanging takes down instead of the run (the call is answered with an error, a fresh worker takes
    the next); "thread", in a thread of the training process (a hung tool's thread is left running,
    and os._exit() ends the run)."""
    environment_timeout_s: float = 600.0
    """Seconds one call into the environment may take (building it, `reset`, `step`,
    `reward_columns`); a call still running then stops the run (exit code 2, naming the environment;
    the last checkpoint intact). 0: no limit."""
    credit: Literal["episode", "turn"] = "episode"
    """"episode": every model token of an episode takes the advantage of its total reward; "turn":
    each turn's tokens take the sum of the group-normalised rewards of that turn and the later ones
    (DeepSeekMath's process supervision), for environments that reward single turns."""

    @property
    def plays_episodes(self) -> bool:
        """Rollouts are episodes of several turns: an environment or tools are named."""
        return bool(self.environment or self.tools)

    def tokens_after_prompt(self, rollout) -> int:
        """The most tokens a rollout adds after its prompt: an episode's budget, else one completion's
        (`rollout`: the recipe's RolloutConfig)."""
        return self.max_episode_tokens if self.plays_episodes else rollout.max_new_tokens
