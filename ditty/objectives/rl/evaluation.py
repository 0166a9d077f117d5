"""The RL rows' evaluation: the greedy reward of held-out prompts, beside the built-in task's exact match.

Prompt data has no completions to compute a validation loss on, so this takes the place of the data
mode's evaluation: `val_reward` (and `val_reward/NAME` with several functions) is the reward
functions' score of greedy completions of the first `train.eval_samples` held-out prompts, split
among ranks; `val_exact_match` comes from a built-in task's held-out set.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ditty._utils.dist import all_reduce_sum, rank, world_size
from ditty.data.task import greedy_generate_ids
from ditty.objectives.rewards.functions import RewardFunction, score_completions


class RolloutEvaluation:
    def __init__(
        self, bundle: Any, functions: Sequence[RewardFunction], tokenizer: Any, max_new_tokens: int, timeout_s: float
    ) -> None:
        self.bundle = bundle
        self.functions = list(functions)
        self.tokenizer = tokenizer
        self.max_new_tokens, self.timeout_s = max_new_tokens, timeout_s

    @torch.no_grad()
    def evaluate(self, request: Any) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        bundle = self.bundle
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
                texts = greedy_generate_ids(
                    request.model, self.tokenizer, batch["prompt_ids"], request.device, self.max_new_tokens
                )
            if not indices[start : start + size]:
                continue
            scores = score_completions(
                self.functions, batch["prompts"], texts, batch["columns"], timeout_s=self.timeout_s
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
