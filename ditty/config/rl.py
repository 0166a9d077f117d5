"""`[rl]`: reinforcement learning with verifiable rewards (GRPO and its variants).

Defaults are TRL's GRPOConfig's where TRL has one (num_generations -> group_size,
max_completion_length -> max_new_tokens, epsilon/epsilon_high -> clip_low/clip_high,
num_iterations -> updates_per_rollout, importance_sampling_level -> importance, loss_type -> loss,
mask_truncated_completions -> mask_truncated). `train.global_batch_size` counts completions, as
TRL's generation batch: each step samples global_batch_size / group_size prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass(frozen=True)
class RLConfig:
    kind: Literal["none", "grpo"] = "none"
    """"grpo": sample `group_size` completions per prompt with the live policy, score them with the
    reward functions, and train the clipped policy loss on their advantages (needs data.format = "prompt")."""
    advantage: Literal["group", "rloo"] = "group"
    """How a completion's reward becomes its advantage: "group" normalises it by its group's mean (and
    std, see scale_rewards: GRPO); "rloo" subtracts the mean of the OTHER completions of its prompt
    (the leave-one-out baseline of RLOO, Ahmadian et al. 2024; TRL's RLOOTrainer)."""
    group_size: int = 8
    """Completions sampled per prompt (TRL: num_generations)."""
    max_new_tokens: int = 512
    """Most tokens generated per completion (TRL: max_completion_length); longer ones are truncated."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    top_p: float = 1.0
    """Nucleus sampling of the rollouts (1.0: off)."""
    loss: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    """Normalisation of the policy loss: "grpo" per sequence then over sequences, "dapo" per token of
    the global batch, "dr_grpo" by sequences x max_new_tokens (TRL: loss_type)."""
    clip_low: float = 0.2
    """Lower clip of the importance ratio, 1 - clip_low (TRL: epsilon)."""
    clip_high: Optional[float] = None
    """Upper clip, 1 + clip_high; unset: clip_low (DAPO's clip-higher uses 0.28; TRL: epsilon_high)."""
    importance: Literal["token", "sequence"] = "token"
    """Importance ratio per token, or GSPO's per sequence (TRL: importance_sampling_level)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide the centred rewards by the std of their group, of the whole batch, or not at all (Dr. GRPO)."""
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
    list[float] (TRL's signature); e.g. "ditty.objectives.builtin_rewards:exact_match"."""
    reward_weights: Optional[list[float]] = None
    """One weight per reward function; unset: every weight 1.0."""
    reward_timeout_s: float = 600.0
    """Seconds one reward function may take on one batch of completions; a function still running
    then stops the run (exit code 2, the last checkpoint intact). 0: no limit. A function that calls
    os._exit() ends the process at once: that cannot be caught in-process."""
    backend: Literal["generate", "vllm", "vllm-server", "transformers"] = "generate"
    """What samples the rollouts: "generate", transformers' `generate` with a KV cache on the live policy
    in the training process; "vllm", a vLLM engine colocated in each training process (weights synced
    from the policy whenever an optimizer step moved it); "vllm-server", a vLLM server in another process
    or machine (`ditty rollout-server`, or your own `vllm serve`) at `rl.vllm_server`, sent the weights
    by a path after each step. "transformers" is the old name of "generate". The vLLM backends need vllm
    (`pip install "ditty[vllm]"`; on a CPU machine `make setup-vllm`, then `.venv-vllm/bin/ditty`)."""
    vllm_memory: float = 0.3
    """The colocated engine's share of the accelerator's memory (vLLM's gpu_memory_utilization; TRL's
    vllm_gpu_memory_utilization, 0.3 in its colocate mode), taken from what the trainer can use. On a
    CPU the engine gets the KV cache one step's rollouts need, at most this share of the machine's memory."""
    vllm_server: str = "http://127.0.0.1:8000"
    """The rollout server's address ("vllm-server"): its OpenAI-compatible endpoint and, with
    VLLM_SERVER_DEV_MODE=1 (`ditty rollout-server` sets it), /collective_rpc for weight reloads."""
    vllm_timeout_s: float = 120.0
    """Seconds one request to the rollout server may take (a sampling call, a weight reload) before the
    run retries it; a server still unreachable after `rl.vllm_retries` tries stops the run (exit 2)."""
    vllm_retries: int = 3
    """Tries of a failed request to the rollout server (a dead server, a timeout), 2 s apart, doubling."""
    max_staleness: int = 0
    """How many optimizer steps older than the policy a step's rollouts may be. 0: every step samples with
    its own weights, then trains (the synchronous loop). 1: one-step-async: the rollouts of step t+1 are
    sampled (on a sampler thread) while step t trains, so they are one update old; needs a vLLM backend."""
    sampler_correction: Literal["none", "tis", "mis"] = "none"
    """Off-policy correction for what the sampler drew with another distribution than the trainer's (the
    engine's numerics, stale weights): "tis" multiplies each token's loss by its truncated importance
    weight min(exp(logp_trainer - logp_sampler), correction_cap) (TRL: token_truncate); "mis" masks the
    completions whose sequence weight exp(sum of the differences) exceeds correction_cap (TRL:
    sequence_mask). Needs a sampler that reports its log-probabilities (a vLLM backend)."""
    correction_cap: float = 3.0
    """The cap C of sampler_correction (TRL: vllm_importance_sampling_clip_max, 3.0)."""
    generation_batch_size: int = 0
    """Prompts per `generate` call on each rank; 0: all of the rank's prompts of a step at once."""
    environment: str = ""
    """The environment episodes run in, as "package.module:Name": a class with `reset(row) ->
    observation` (the first messages, from the prompt row) and `step(completion) -> StepResult` (the
    next observation, a reward, done, metrics; ditty.objectives.rl.environment). Unset: the built-in
    tool environment when `tools` are named, else one turn scored by the reward functions."""
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

    @property
    def tokens_after_prompt(self) -> int:
        """The most tokens a rollout adds after its prompt: an episode's budget, else one completion's."""
        return self.max_episode_tokens if self.plays_episodes else self.max_new_tokens
