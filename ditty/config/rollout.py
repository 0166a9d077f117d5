"""`[rollout]`: how every on-policy row samples: GRPO and RLOO (`[rl]`), online preference pairs
(`[preference] pairs = "online"`) and on-policy distillation (`[distill]`).

One section, read by every row that samples from the policy it trains: the engine (`backend`), the
sampling settings, the vLLM engine's and server's settings, sampling ahead of the training
(`max_staleness`) and the correction for what a sampler with weights and numerics of its own drew.
These keys were `[rl]`'s (and `distill.max_new_tokens`); written there they still work, with a warning
naming the key here. Defaults are TRL's where TRL has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RolloutConfig:
    backend: Literal["generate", "vllm", "vllm-server", "transformers"] = "generate"
    """What samples: "generate", transformers' `generate` with a KV cache on the live policy in the
    training process; "vllm", a vLLM engine colocated in each training process (weights synced from
    the policy whenever an optimizer step moved it); "vllm-server", a vLLM server in another process
    or machine (`ditty rollout-server`, or your own `vllm serve`) at `rollout.vllm_server`, sent the
    weights by a path after each step. "transformers" is the old name of "generate". The vLLM
    backends need vllm (`pip install "ditty[vllm]"`; on a CPU machine `make setup-vllm`, then
    `.venv-vllm/bin/ditty`)."""
    temperature: float = 1.0
    """Sampling temperature (GRPO's rollouts, online pairs' candidates, a distilled student's samples)."""
    top_p: float = 1.0
    """Nucleus sampling (1.0: off)."""
    max_new_tokens: int = 512
    """Most tokens sampled per completion (TRL: max_completion_length); longer ones are truncated."""
    generation_batch_size: int = 0
    """Prompts per sampling call on each rank; 0: all of the rank's prompts of a step at once."""
    vllm_memory: float = 0.3
    """The colocated engine's share of the accelerator's memory (vLLM's gpu_memory_utilization; TRL's
    vllm_gpu_memory_utilization, 0.3 in its colocate mode), taken from what the trainer can use. On a
    CPU the engine gets the KV cache one step's samples need, at most this share of the machine's memory."""
    vllm_server: str = "http://127.0.0.1:8000"
    """The rollout server's address ("vllm-server"): its OpenAI-compatible endpoint and, with
    VLLM_SERVER_DEV_MODE=1 (`ditty rollout-server` sets it), /collective_rpc for weight reloads."""
    vllm_timeout_s: float = 120.0
    """Seconds one request to the rollout server may take (a sampling call, a weight reload) before the
    run retries it; a server still unreachable after `rollout.vllm_retries` tries stops the run (exit 2)."""
    vllm_retries: int = 3
    """Tries of a failed request to the rollout server (a dead server, a timeout), 2 s apart, doubling."""
    max_staleness: int = 0
    """How many optimizer updates older than the policy a step's samples may be. 0: every step samples
    with its own weights, then trains (the synchronous loop). k > 0: the samples of the next k steps are
    drawn on a sampler thread while this step trains, each with the weights of the update it was drawn
    at, so a step trains on samples at most k updates old; needs a vLLM backend."""
    sampler_correction: Literal["none", "tis", "mis"] = "none"
    """Off-policy correction for what the sampler drew with another distribution than the trainer's (the
    engine's numerics, stale weights): "tis" multiplies each token's loss by its truncated importance
    weight min(exp(logp_trainer - logp_sampler), correction_cap) (TRL: token_truncate); "mis" masks the
    completions whose sequence weight exp(sum of the differences) exceeds correction_cap (TRL:
    sequence_mask). Needs a sampler that reports its log-probabilities (a vLLM backend)."""
    correction_cap: float = 3.0
    """The cap C of sampler_correction (TRL: vllm_importance_sampling_clip_max, 3.0)."""
    sync_bucket_mb: int = 512
    """The "vllm-server" backend gets the policy's weights as safetensors shards of about this many MB,
    each gathered (under FSDP) and written before the next: no rank holds more than one shard beyond
    its part of the policy. The "vllm" engine in the process is streamed one parameter at a time;
    a step sampled ahead (max_staleness > 0) keeps one whole copy for its sampler thread."""

    @property
    def engine(self) -> str:
        """The backend by its current name ("transformers" is "generate")."""
        return "generate" if self.backend == "transformers" else self.backend
