"""The sampler interface, and the sampler `rl.backend` chooses.

A sampler has one job: `sample(prompt_ids, first_position, max_new_tokens=None) -> RolloutBatch`, a
group of `rl.group_size` completions of every prompt (rows in prompt order), seeded by the prompts'
global positions (`first_position` is the first prompt's place in the global order), so the same
prompts draw the same completions on any world size and after a resume. A call's `max_new_tokens`
can only shorten the completions: the lower of it and `rl.max_new_tokens` applies (`new_tokens`).

- "generate" (ditty.objectives.rl.sampling.GenerateSampler): transformers' generate on the live policy.
  It has no weights of its own: it always samples with the policy as it is.
- "vllm" (ditty.objectives.rl.vllm_sampler.VLLMSampler): a vLLM engine in the training process.
- "vllm-server" (ditty.objectives.rl.vllm_server.ServerSampler): a vLLM server in another process.

The vLLM samplers hold weights of their own, so they also have `capture(version)` and `load(captured)`:
the rollout stream brings them to the policy's version before sampling with it. `capture` runs on the
training thread between steps (it reads the live weights: a gather under FSDP, a merge under LoRA) and
returns None when the sampler has that version already; `load` may run on the sampler thread of
rl.max_staleness > 0, just before the `sample` it serves. Both report their log-probabilities
(`RolloutBatch.sampler_logps`), which the trainer compares with its own (ditty.objectives.rl.correction).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

from ditty.objectives.rl.batch import RolloutBatch


class Sampler(Protocol):
    def sample(
        self, prompt_ids: list[list[int]], first_position: int = 0, max_new_tokens: Optional[int] = None
    ) -> RolloutBatch: ...


def new_tokens(rl: Any, max_new_tokens: Optional[int]) -> int:
    """The most tokens a completion of this call may have: `rl.max_new_tokens`, or a call's tighter cap."""
    return rl.max_new_tokens if max_new_tokens is None else min(max_new_tokens, rl.max_new_tokens)


def holds_weights(sampler: Any) -> bool:
    """Whether `sampler` samples with a copy of the weights that has to follow the policy."""
    return hasattr(sampler, "capture") and hasattr(sampler, "load")


def sync_weights(sampler: Any, version: int) -> None:
    """Bring a sampler with weights of its own to the policy at `version` (the synchronous loop)."""
    if holds_weights(sampler):
        captured = sampler.capture(version)
        if captured is not None:
            sampler.load(captured)


def build_sampler(run: Any, policy: Any) -> Any:
    """The sampler of `rl.backend` for the run; `policy()` returns the live, unwrapped policy."""
    from ditty.objectives.rl.backend_rules import backend

    rl, runtime, seed = run.config.rl, run.runtime, run.config.run.seed
    chosen = backend(rl)
    if chosen == "vllm":
        from ditty.objectives.rl.vllm_sampler import VLLMSampler

        return VLLMSampler(
            policy,
            rl,
            run.tokenizer,
            seed=seed,
            max_prompt_tokens=run.config.data.max_seq_len,
            completions_per_step=run.config.train.global_batch_size // runtime.world_size,
        )
    if chosen == "vllm-server":
        from ditty.objectives.rl.vllm_server import ServerSampler

        return ServerSampler(policy, rl, run.tokenizer, seed=seed, run_dir=run.config.run.output_dir, rank=runtime.rank)
    from ditty.objectives.rl.sampling import GenerateSampler

    return GenerateSampler(policy, rl, run.tokenizer, runtime.device, seed)


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
    from ditty.objectives.rl.sampling import sampling_seed

    return sampling_seed(run_seed, position) % (2**62)
