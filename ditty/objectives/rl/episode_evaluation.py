"""The held-out evaluation of episodes with an environment: greedy episodes of the first
`train.eval_samples` held-out prompt rows, split among ranks.

- `val_exact_match`: the final model turn equals the row's reference answer (column `answer`, else
  `completion`), stripped; the task's one-turn exact match would score the tool call instead;
- `val_reward` (and `val_reward/NAME` with several functions): the episodes' reward;
- `val_env/turns`, `val_env/tool_calls`, `val_env/tool_errors`, `val_env/truncated` (per episode) and
  `val_env/well_formed_calls`: the share of the tool calls the model attempted that were well formed
  (0 when it attempted none).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ditty._utils.dist import all_reduce_sum, rank, world_size

TOTALS = (
    "reward",
    "exact",
    "env/turns",
    "env/tool_calls",
    "env/tool_errors",
    "env/tool_errors/malformed",
    "env/truncated",
)


class EpisodeEvaluation:
    def __init__(self, bundle: Any, environment: Any, sampler: Any) -> None:
        self.bundle, self.environment, self.sampler = bundle, environment, sampler

    @torch.no_grad()
    def evaluate(self, request: Any) -> dict[str, Any]:
        val = self.bundle.val
        if val is None or len(val) == 0 or request.eval_samples <= 0:
            return {}
        count = min(request.eval_samples, len(val))
        indices = list(range(rank(), count, world_size()))
        size = max(1, request.micro_batch_size)
        calls = math.ceil(math.ceil(count / world_size()) / size)  # the same on every rank (fsdp's forwards)
        functions = [f.name for f in self.environment.functions]
        totals = torch.zeros(len(TOTALS) + len(functions), dtype=torch.float64)
        for call in range(calls):
            chunk = indices[call * size : (call + 1) * size]
            batch = self.bundle.collator([val[i] for i in (chunk or [0])])  # an idle rank plays with the others
            with request.autocast():
                rollouts = self.environment.run(self.sampler, batch, call * size, 1, greedy=True)
            if not chunk:
                continue
            references = batch["columns"].get("answer") or batch["columns"].get("completion")
            exact = [
                float(references is not None and t.strip() == str(r).strip())
                for t, r in zip(rollouts.texts, references or [])
            ]
            values = {"reward": rollouts.rewards, "exact": torch.tensor(exact, dtype=torch.float64)}
            for index, name in enumerate(TOTALS):
                found = values.get(name, rollouts.episode_metrics.get(name))
                totals[index] += float(found.sum()) if found is not None else 0.0
            for index, name in enumerate(functions):
                totals[len(TOTALS) + index] += float(rollouts.rewards_per_function[name].sum())
        totals = all_reduce_sum(totals)
        sums = dict(zip(TOTALS, totals.tolist()))
        metrics = {
            "val_reward": sums["reward"] / count,
            "val_exact_match": sums["exact"] / count,
            "val_env/turns": sums["env/turns"] / count,
            "val_env/tool_calls": sums["env/tool_calls"] / count,
            "val_env/tool_errors": sums["env/tool_errors"] / count,
            "val_env/truncated": sums["env/truncated"] / count,
            "val_env/well_formed_calls": (
                1 - sums["env/tool_errors/malformed"] / sums["env/tool_calls"] if sums["env/tool_calls"] else 0.0
            ),
        }
        if len(functions) > 1:
            for index, name in enumerate(functions):
                metrics[f"val_reward/{name}"] = float(totals[len(TOTALS) + index]) / count
        return metrics
