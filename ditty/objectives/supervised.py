"""The supervised rows (ditty.objectives.table): the model task's own loss on its data, the reward
model's Bradley-Terry loss included (a model-task row of ditty.models.tasks names both)."""

from __future__ import annotations

from typing import Any, Iterator

from ditty.config.errors import Problem, RecipeError, error
from ditty.objectives.parts import ObjectiveParts


def build_supervised(run: Any) -> ObjectiveParts:
    """A registered model spec's loss (ditty.models.registry), else the model task's (which needs
    token data: `train.loss_chunks` picks the causal LM's chunked loss)."""
    from ditty.models.tasks import model_task

    spec = getattr(run.engine.unwrap(run.model), "ditty_spec", None)
    if spec is not None:
        return ObjectiveParts(loss=spec.make_loss())
    if not run.data.token_batches:
        raise RecipeError.single(
            "non-text data needs a loss: the default causal-LM loss needs token labels",
            key="pipeline.loss",
            fix='add [[pipeline.loss]] use = "ditty.loss:MSELoss" (or pass loss_calculator=)',
        )
    return ObjectiveParts(loss=model_task(run.config.model.task).loss(run.config.train))


def supervised_rules(ctx: Any) -> Iterator[Problem]:
    """Prompts alone have nothing to imitate: they are the data of the objectives that sample."""
    data = ctx.config.data
    if data.format == "prompt" or "prompt" in [s.format for s in data.sources]:
        yield error(
            "data.format",
            'data.format = "prompt" has no completions to learn from without reinforcement learning',
            'set [rl] kind = "grpo" with reward functions (or [preference] pairs = "online"), or use '
            'data.format = "prompt_completion"',
        )


def reward_model_card(config: Any) -> str:
    return "; a Bradley-Terry reward model of preference pairs (one score per text)"
