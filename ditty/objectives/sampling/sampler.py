"""The sampler interface, and the sampler `rollout.backend` chooses.

A sampler does one thing: token ids in, token ids out, seeded by the prompts' global positions, so
the same prompts draw the same samples on any world size and after a resume:
- `sample(prompt_ids, first_position, max_new_tokens=None) -> RolloutBatch`: `group_size` samples of
  every prompt (rows in prompt order); `first_position` is the first prompt's place in the global
  order; a call's `max_new_tokens` can only shorten them (the lower of it and
  `rollout.max_new_tokens` applies: `new_tokens`);
- `generate_turn(turn) -> TurnOutput`: one model turn of each open episode of a `TurnRequest`
  (ditty.objectives.sampling.generate_sampler), its tokens and, where the sampler has them, their log-probabilities.

- "generate" (ditty.objectives.sampling.generate_sampler.GenerateSampler): transformers' generate on the live policy.
  It has no weights of its own: it always samples with the policy as it is.
- "vllm" (ditty.objectives.sampling.vllm_sampler.VLLMSampler): a vLLM engine in the training process.
- "vllm-server" (ditty.objectives.sampling.vllm_server.ServerSampler): a vLLM server in another process.

The vLLM samplers hold weights of their own (`holds_weights`), so `capture(version)` and
`load(captured)` bring them to the policy's version before they sample (ditty.objectives.sampling.
policy_sampling does, for every row): `capture` runs on the training thread between steps (it reads
the live weights: a gather under FSDP, a merge under LoRA) and returns None when the sampler has that
version already; `load` may run on the sampler thread of rollout.max_staleness > 0, just before the
sampling it serves. Both report their log-probabilities (`RolloutBatch.sampler_logps`), which the
trainer compares with its own (ditty.objectives.sampling.correction).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ditty.objectives.sampling.batch import RolloutBatch


@dataclass
class TurnOutput:
    """A turn's samples: each open episode's tokens (through its end-of-sequence token) and, where the
    sampler reports them, their log-probabilities (None: it does not, as `generate` does not)."""

    tokens: list[list[int]]
    logps: Optional[list[list[float]]] = None


class Sampler(ABC):
    """See the module doc: what a backend implements (a user's own too, named by `Sampler` subclasses)."""

    holds_weights: bool = False
    """Samples with a copy of the policy's weights that has to follow it (a vLLM engine or server)."""

    @abstractmethod
    def sample(
        self, prompt_ids: list[list[int]], first_position: int = 0, max_new_tokens: Optional[int] = None
    ) -> RolloutBatch: ...

    @abstractmethod
    def generate_turn(self, turn: Any) -> TurnOutput: ...

    def capture(self, version: int, copy: bool = False) -> Any:
        """(version, what `load` needs), or None when the sampler holds `version` already (always None for
        a sampler without weights of its own). `copy`: what a step running meanwhile cannot change."""
        return None

    def load(self, captured: Any) -> None:  # noqa: B027  (a sampler of the live policy has nothing to load)
        """Take the weights `capture` read."""

    def close(self) -> None:  # noqa: B027  (most samplers hold nothing to free)
        """Free what the sampler holds (an engine, a connection)."""


def new_tokens(rollout: Any, max_new_tokens: Optional[int]) -> int:
    """The most tokens a completion of this call may have: `rollout.max_new_tokens`, or a call's tighter cap."""
    return rollout.max_new_tokens if max_new_tokens is None else min(max_new_tokens, rollout.max_new_tokens)


def sync_weights(sampler: Sampler, version: int) -> None:
    """Bring a sampler with weights of its own to the policy at `version` (the synchronous loop)."""
    captured = sampler.capture(version)
    if captured is not None:
        sampler.load(captured)


def build_sampler(
    run: Any, policy: Any, *, group_size: int, rollout: Any = None, tokens_after_prompt: Optional[int] = None
) -> Sampler:
    """The sampler of `rollout.backend` for the run, drawing `group_size` samples of each prompt;
    `policy()` returns the live, unwrapped policy. `rollout`: the run's [rollout] unless a row narrows it
    (distillation's samples hold at most data.max_seq_len tokens); `tokens_after_prompt`: the most a
    sample adds after its prompt (an episode's budget), else `rollout.max_new_tokens`."""
    from ditty.objectives.sampling.rollout_rules import backend

    config, runtime, seed = run.config, run.runtime, run.config.run.seed
    rollout = rollout or config.rollout
    chosen = backend(rollout)
    if chosen == "vllm":
        from ditty.objectives.sampling.vllm_sampler import VLLMSampler

        after = tokens_after_prompt if tokens_after_prompt is not None else rollout.max_new_tokens
        return VLLMSampler(
            policy,
            rollout,
            group_size,
            run.tokenizer,
            seed=seed,
            max_model_len=config.data.max_seq_len + after,
            completions_per_step=config.train.global_batch_size // runtime.world_size,
        )
    if chosen == "vllm-server":
        from ditty.objectives.sampling.vllm_server import ServerSampler

        return ServerSampler(
            policy, rollout, group_size, run.tokenizer, seed=seed, run_dir=config.run.output_dir, rank=runtime.rank
        )
    from ditty.objectives.sampling.generate_sampler import GenerateSampler

    return GenerateSampler(policy, rollout, group_size, run.tokenizer, runtime.device, seed)


def rollouts_from_tokens(
    prompt_ids: Sequence[list[int]],
    completions: Sequence[list[int]],
    logps: Sequence[list[float]],
    eos: Optional[int],
    tokenizer: Any,
) -> RolloutBatch:
    """A RolloutBatch from an engine's completions (token ids up to and including the end-of-sequence
    token, or cut at max_new_tokens) with their log-probabilities, one row per completion; the text is
    decoded as GenerateSampler decodes it (the end-of-sequence token and special tokens left out)."""
    out = RolloutBatch([], [], [], [], sampler_logps=[])
    for prompt, ids, values in zip(prompt_ids, completions, logps):
        ended = eos is not None and eos in ids
        ids = ids[: ids.index(eos) + 1] if ended else list(ids)
        out.prompt_ids.append(list(prompt))
        out.completion_ids.append(ids)
        out.texts.append(tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True))
        out.truncated.append(not ended)
        values = [float(v) for v in values[: len(ids)]]
        out.sampler_logps.append(values + [float("nan")] * (len(ids) - len(values)))  # NaN: not reported
    return out


def prompt_seed(run_seed: int, position: int) -> int:
    """The engine's seed of the prompt at global `position` (its group's completions take this seed
    + 0, 1, ...: vLLM's n > 1). Drawn from the same formula as generate's, in vLLM's int64 range."""
    from ditty.objectives.sampling.generate_sampler import sampling_seed

    return sampling_seed(run_seed, position) % (2**62)
