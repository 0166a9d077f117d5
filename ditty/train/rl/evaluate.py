"""Validation under `[rl]`: the greedy reward of held-out prompts, beside the built-in task's exact match.

`RLEvaluation` wraps the data mode built for the prompt data and hands everything through except
`evaluate` (prompt batches have no loss to validate) and the counts (rollout batches are counted by
the GRPO loss and their attention mask).
"""

from __future__ import annotations

from typing import Any

import torch

from ditty.objectives.rewards import RewardFunction, score_completions
from ditty.train.step import all_reduce_sum


class RLEvaluation:
    def __init__(self, inner: Any, functions: list[RewardFunction], tokenizer: Any, rl: Any) -> None:
        self.inner = inner
        self.functions = functions
        self.tokenizer = tokenizer
        self.rl = rl

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def supervised_count(self, batch: Any, loss: Any) -> torch.Tensor:
        return loss.count_tokens(batch)

    def input_count(self, batch: Any) -> torch.Tensor:
        return batch["attention_mask"].sum()

    @torch.no_grad()
    def evaluate(self, request: Any) -> dict[str, Any]:
        """val_reward (and val_reward/NAME): the reward functions on greedy completions of the first
        `train.eval_samples` held-out prompts; val_exact_match for a built-in task's held-out set."""
        from ditty._utils.dist import rank, world_size

        metrics: dict[str, Any] = {}
        bundle = self.inner.bundle
        if bundle.task is not None and request.eval_samples > 0:
            with request.autocast():
                scores = bundle.task.evaluate(request.model, self.tokenizer, request.device, request.eval_samples)
            metrics.update({f"val_{name}": value for name, value in scores.items()})
        val = bundle.val
        if val is None or len(val) == 0 or request.eval_samples <= 0:
            return metrics
        count = min(request.eval_samples, len(val))
        indices = list(range(rank(), count, world_size()))
        totals = torch.zeros(1 + len(self.functions), dtype=torch.float64)
        size = max(1, request.micro_batch_size)
        for start in range(0, max(len(indices), 1), size):
            chunk = indices[start : start + size] or [0]  # a rank without prompts still steps with the others
            batch = bundle.collator([val[i] for i in chunk])
            with request.autocast():
                texts = greedy(
                    request.model, self.tokenizer, batch["prompt_ids"], self.rl.max_new_tokens, request.device
                )
            if not indices[start : start + size]:
                continue
            scores = score_completions(
                self.functions, batch["prompts"], texts, batch["columns"], timeout_s=self.rl.reward_timeout_s
            )
            totals[0] += scores.total.sum()
            for index, function in enumerate(self.functions):
                totals[1 + index] += scores.per_function[function.name].sum()
        totals = all_reduce_sum(totals) / count
        metrics["val_reward"] = float(totals[0])
        if len(self.functions) > 1:
            for index, function in enumerate(self.functions):
                metrics[f"val_reward/{function.name}"] = float(totals[1 + index])
        return metrics


def greedy(model: Any, tokenizer: Any, prompt_ids: list[list[int]], max_new_tokens: int, device: Any) -> list[str]:
    """Greedy completions (KV cache) of token prompts, left-padded, each cut at its end-of-sequence."""
    import torch.distributed as dist
    from transformers import GenerationConfig

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    width = max(len(ids) for ids in prompt_ids)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompt_ids], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids], device=device)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, eos_token_id=eos, pad_token_id=pad, use_cache=True
    )
    synced = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    was_training = model.training
    model.eval()
    try:
        generated = model.generate(
            input_ids=input_ids, attention_mask=mask, generation_config=config, synced_gpus=synced
        )
    finally:
        model.train(was_training)
    texts = []
    for row in generated[:, width:].tolist():
        row = row[: row.index(eos)] if eos is not None and eos in row else row
        texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return texts
