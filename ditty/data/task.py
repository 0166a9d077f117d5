"""A task metric: exact match of greedy generations against reference answers on held-out prompts.

Generation is written out here (no `model.generate`) for two reasons: every prompt gets the SAME
number of new tokens, so in a distributed run every rank runs the same number of forwards (FSDP
would hang if one rank stopped early at an end-of-sequence token); and it needs nothing from the
model beyond `forward(input_ids, attention_mask, position_ids)` returning logits. There is no
KV cache: each new token re-runs the (short) prompt, which costs little for task prompts of a few
dozen tokens and keeps custom models working.
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
            predictions += greedy_generate(model, tokenizer, batch, device, self.max_new_tokens)
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
) -> list[str]:
    """Greedy continuations of `prompts`, each cut at its first end-of-sequence token.

    Prompts are encoded exactly as in training (`tokenizer(prompt)`, special tokens included) and
    left-padded, so the next token of every row is read at the last column. Position ids count only
    real tokens, so a padded prompt sees the positions it would see alone.
    """
    import torch

    encoded = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    width = max(len(ids) for ids in encoded)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in encoded], device=device)
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for _ in range(max_new_tokens):
                position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
                output = model(
                    input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
                )
                logits = output.logits if hasattr(output, "logits") else output[0]
                next_tokens = logits[:, -1, :].argmax(dim=-1, keepdim=True)
                input_ids = torch.cat([input_ids, next_tokens], dim=1)
                attention_mask = torch.cat([attention_mask, torch.ones_like(next_tokens)], dim=1)
    finally:
        model.train(was_training)

    generated = input_ids[:, width:].tolist()
    return [tokenizer.decode(_until_eos(ids, tokenizer.eos_token_id), skip_special_tokens=True) for ids in generated]


def _until_eos(ids: list[int], eos_id: int | None) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id is not None and eos_id in ids else ids
