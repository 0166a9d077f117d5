"""A task metric: exact match of greedy generations against reference answers on held-out prompts.

Generation goes through transformers' `generate` with its KV cache (greedy, stopping when every row
has produced its end-of-sequence token), so each new token costs one token's forward instead of
re-running the whole prefix. In a distributed run every rank must run the same number of forwards
(FSDP and ZeRO-3 gather parameters inside each forward; a rank that stopped early would hang the
others): `synced_gpus` keeps every rank stepping until all are done. Models without `generate`
(custom nn.Modules) use the uncached loop, which needs nothing but `forward(input_ids,
attention_mask, position_ids)` returning logits and always runs `max_new_tokens` forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Task:
    """Held-out prompts with their reference answers, scored by greedy exact match.

    Every rank evaluates the same first `max_samples` prompts in the same batches, so all ranks
    agree on the metric without communicating and run identical forward shapes.
    """

    name: str
    prompts: tuple[str, ...]
    answers: tuple[str, ...]
    max_new_tokens: int
    """Tokens generated for every prompt: the longest reference answer plus its end-of-sequence token."""
    batch_size: int = 64
    add_special_tokens: bool = True
    """Encode the prompts with the tokenizer's special tokens (plain text); False for prompts a chat
    template rendered with its own (ditty.data.conversation)."""

    def evaluate(
        self,
        model: "torch.nn.Module",
        tokenizer: "PreTrainedTokenizerBase",
        device: "torch.device | str",
        max_samples: int,
    ) -> dict[str, float]:
        """{"exact_match": fraction of the first `max_samples` prompts answered exactly}."""
        count = min(max_samples, len(self.prompts))
        if count == 0:
            return {"exact_match": 0.0}
        prompts, answers = self.prompts[:count], self.answers[:count]
        predictions: list[str] = []
        for start in range(0, count, self.batch_size):
            batch = list(prompts[start : start + self.batch_size])
            predictions += greedy_generate(
                model, tokenizer, batch, device, self.max_new_tokens, add_special_tokens=self.add_special_tokens
            )
        return {"exact_match": exact_match(predictions, answers)}


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Fraction of predictions equal to their reference, ignoring surrounding whitespace."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not references:
        return 0.0
    hits = sum(p.strip() == r.strip() for p, r in zip(predictions, references))
    return hits / len(references)


def greedy_generate(
    model: "torch.nn.Module",
    tokenizer: "PreTrainedTokenizerBase",
    prompts: list[str],
    device: "torch.device | str",
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    add_special_tokens: bool = True,
) -> list[str]:
    """Greedy continuations of `prompts`, each cut at its first end-of-sequence token.

    Prompts are encoded exactly as in training (`tokenizer(prompt)`, special tokens included unless
    `add_special_tokens` is false, as for text a chat template rendered with its own), then as
    `greedy_generate_ids`.
    """
    encoded = [tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"] for prompt in prompts]
    return greedy_generate_ids(model, tokenizer, encoded, device, max_new_tokens, use_cache=use_cache)


def greedy_generate_ids(
    model: "torch.nn.Module",
    tokenizer: "PreTrainedTokenizerBase",
    prompt_ids: list[list[int]],
    device: "torch.device | str",
    max_new_tokens: int,
    *,
    use_cache: bool = True,
) -> list[str]:
    """Greedy continuations of token prompts, decoded and each cut at its first end-of-sequence token.

    Prompts are left-padded, so the next token of every row is read at the last column. Position ids
    count only real tokens, so a padded prompt sees the positions it would see alone. `use_cache=False`
    (or a model without `generate`) re-runs the prefix for every token: the same tokens, much slower.
    """
    import torch

    from ditty._utils.eager import eager_decoding

    width = max(len(ids) for ids in prompt_ids)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + list(ids) for ids in prompt_ids], device=device)
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids], device=device)

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), eager_decoding():
            if use_cache and _can_generate(model):
                generated = _cached(model, input_ids, attention_mask, max_new_tokens, tokenizer.eos_token_id, pad_id)
            else:
                generated = _uncached(model, input_ids, attention_mask, max_new_tokens)
    finally:
        model.train(was_training)
    rows = generated[:, width:].tolist()
    return [tokenizer.decode(_until_eos(ids, tokenizer.eos_token_id), skip_special_tokens=True) for ids in rows]


def _can_generate(model: "torch.nn.Module") -> bool:
    can = getattr(model, "can_generate", None)
    return callable(getattr(model, "generate", None)) and (not callable(can) or bool(can()))


def _cached(model, input_ids, attention_mask, max_new_tokens: int, eos_id, pad_id) -> "torch.Tensor":
    """transformers' greedy search with the KV cache, from a fresh GenerationConfig: a model's own
    generation defaults (sampling, repetition penalty, ...) do not apply to the metric."""
    import torch.distributed as dist
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_cache=True,
    )
    synced = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return model.generate(
        input_ids=input_ids, attention_mask=attention_mask, generation_config=config, synced_gpus=synced
    )


def _uncached(model, input_ids, attention_mask, max_new_tokens: int) -> "torch.Tensor":
    """Every new token re-runs the whole prefix; exactly `max_new_tokens` forwards on every rank."""
    import torch

    for _ in range(max_new_tokens):
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        logits = output.logits if hasattr(output, "logits") else output[0]
        next_tokens = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        input_ids = torch.cat([input_ids, next_tokens], dim=1)
        attention_mask = torch.cat([attention_mask, torch.ones_like(next_tokens)], dim=1)
    return input_ids


def _until_eos(ids: list[int], eos_id: int | None) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id is not None and eos_id in ids else ids
