"""The held-out evaluation of episodes with an environment: greedy episodes of the first
`train.eval_samples` held-out prompt rows, split among ranks.

- `val_exact_match`: the final model turn equals the row's reference answer (column `answer`, else
  `completion`), stripped; the task's one-turn exact match would score the tool call instead. Rows
  without either column (a game whose environment holds the answer) report none, rather than 0;
- `val_reward` (and `val_reward/NAME` with several functions): the episodes' reward;
- `val_env/NAME` (per episode) for every metric the episodes report: `turns`, `episode_tokens`,
  `truncated`, the environment's own (a custom environment's `env/right`, say), and with the built-in
  tool environment `tool_calls` and `tool_errors`, and `val_env/well_formed_calls`: the share of the
  tool calls the model attempted that were well formed (0 when it attempted none).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ditty._utils.dist import all_reduce_sum, rank, world_size
from ditty.objectives.rl.stream import names_across


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
        totals = torch.zeros(2 + len(functions), dtype=torch.float64)  # reward, exact, each function's
        env_sums: dict[str, float] = {}
        answered = False  # the same on every rank: every rank's rows have the data's columns
        for call in range(calls):
            chunk = indices[call * size : (call + 1) * size]
            batch = self.bundle.collator([val[i] for i in (chunk or [0])])  # an idle rank plays with the others
            with request.autocast():
                rollouts = self.environment.run(self.sampler, batch, call * size, 1, greedy=True)
            answered = answered or any(name in batch["columns"] for name in ("answer", "completion"))
            if not chunk:
                continue
            references = batch["columns"].get("answer") or batch["columns"].get("completion")
            exact = [
                float(references is not None and t.strip() == str(r).strip())
                for t, r in zip(rollouts.texts, references or [])
            ]
            totals[0] += float(rollouts.rewards.sum())
            totals[1] += sum(exact)
            for index, name in enumerate(functions):
                totals[2 + index] += float(rollouts.rewards_per_function[name].sum())
            for name, values in rollouts.episode_metrics.items():
                env_sums[name] = env_sums.get(name, 0.0) + float(values.sum())
        names = names_across(env_sums, world_size())  # every rank reduces the same metrics
        totals = all_reduce_sum(torch.cat([totals, torch.tensor([env_sums.get(n, 0.0) for n in names])]))
        metrics = {"val_reward": float(totals[0]) / count}
        if answered:
            metrics["val_exact_match"] = float(totals[1]) / count
        if len(functions) > 1:
            for index, name in enumerate(functions):
                metrics[f"val_reward/{name}"] = float(totals[2 + index]) / count
        sums = dict(zip(names, totals[2 + len(functions) :].tolist()))
        metrics.update({f"val_{name}": value / count for name, value in sums.items() if name.count("/") == 1})
        if "env/tool_calls" in sums:
            malformed, calls_made = sums.get("env/tool_errors/malformed", 0.0), sums["env/tool_calls"]
            metrics["val_env/well_formed_calls"] = 1 - malformed / calls_made if calls_made else 0.0
        return metrics
