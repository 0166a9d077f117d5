"""Reinforcement learning with rollouts in the loop (`[rl] kind = "grpo"`), plugged into the trainer
without changing its loop: `attach_rl(trainer)` swaps three built parts.

- the stream: a `RolloutStream` over a stream of prompts (global_batch_size / group_size prompts per
  step, one micro-batch of them per rank) that hands over micro-batches of scored completions;
- the pipeline's loss: `GRPOLoss`, normalised by the trainer over the global batch;
- the data mode's evaluation: `RLEvaluation` adds the greedy reward of held-out prompts (and the
  built-in task's exact match) to the validation metrics.
"""

from __future__ import annotations

from typing import Any

import torch

from ditty.train.rl.evaluate import RLEvaluation
from ditty.train.rl.loss import GRPOLoss, sampling_projection
from ditty.train.rl.rollouts import RolloutStream

__all__ = ["GRPOLoss", "RLEvaluation", "RolloutStream", "attach_rl", "rl_method"]


def rl_method(config: Any) -> str:
    """What the model card's "method" adds for reinforcement learning ("" otherwise)."""
    rl = config.rl
    if rl.kind == "none":
        return ""
    rewards = ", ".join(r.rsplit(":", 1)[-1] for r in rl.rewards) or "reward functions given in Python"
    kl = f", KL beta {rl.beta:g}" if rl.beta > 0 else ""
    settings = f"{rl.loss} loss, {rl.group_size} completions per prompt{kl}, rewards: {rewards}"
    return f"; reinforcement learning: {rl.kind.upper()} ({settings})"


def attach_rl(trainer: Any) -> None:
    """Replace the trainer's stream, loss and evaluation with GRPO's (called after build_pipeline,
    before the checkpoint is restored, so a resume restores the rollout stream's state)."""
    from ditty.data.build import build_stream
    from ditty.objectives.rewards import load_reward_functions
    from ditty.train.pipeline import StageChain

    config, runtime = trainer.config, trainer.runtime
    rl, train = config.rl, config.train
    given = [as_reward_function(f) for f in trainer.components.reward_functions or []]
    references = given or list(rl.rewards)
    functions = load_reward_functions(references, rl.reward_weights)
    prompts_per_step = train.global_batch_size // rl.group_size
    old = trainer.stream
    if hasattr(old, "close"):
        old.close()
    prompts = build_stream(
        trainer.data.bundle,
        config.data,
        global_batch_size=prompts_per_step,
        micro_batch_size=prompts_per_step // runtime.world_size,
        rank=runtime.rank,
        world_size=runtime.world_size,
    )
    reference = build_reference(trainer) if rl.beta > 0 else None
    trainer.stream = RolloutStream(
        prompts,
        rl=rl,
        reward_functions=functions,
        tokenizer=trainer.tokenizer,
        policy=lambda: trainer.engine.unwrap(trainer.model),
        logps=lambda which, batch: rollout_logps(trainer, which, batch, reference),
        micro_batch_size=train.micro_batch_size,
        seed=config.run.seed,
        rank=runtime.rank,
        world_size=runtime.world_size,
        device=runtime.device,
    )
    chunks = train.loss_chunks if train.loss_chunks > 0 else 8
    pipeline = trainer.pipeline
    trainer.pipeline = StageChain(pipeline.preprocessors, pipeline.postprocessors, GRPOLoss(rl, chunks=chunks))
    trainer.data = RLEvaluation(trainer.data, functions, trainer.tokenizer, rl)


def as_reward_function(function: Any) -> Any:
    """A Python API reward function as it is called: TRL's signature unchanged; the original
    library's reward_fn(task, completion_text) wrapped in TaskReward."""
    import inspect

    from ditty.objectives.rewards import TaskReward, signature_problem

    if isinstance(function, TaskReward) or not callable(function) or signature_problem(function) is None:
        return function
    try:
        params = [p for p in inspect.signature(function).parameters.values() if p.kind != p.VAR_KEYWORD]
    except (TypeError, ValueError):
        return function
    return TaskReward(function) if len(params) == 2 else function


def build_reference(trainer: Any) -> Any:
    """The KL reference: None under an adapter (the base with the adapter disabled serves), else a
    frozen copy of the model as `[model]` loads it (the start of training, also after a resume)."""
    if trainer.config.peft.kind != "none":
        return None
    if trainer.components.model is not None:  # a model given in Python: no recipe to load it again from
        model = given_model_copy(trainer)
    else:
        from ditty.models.recipe_model import base_model_for

        model, _ = base_model_for(trainer.config, trainer.tokenizer, trainer.runtime.device, low_memory=False)
    model.eval().requires_grad_(False)
    return model


def given_model_copy(trainer: Any) -> torch.nn.Module:
    """A copy of the policy a caller built (taken before the first step): the KL reference when the
    recipe has no [model] to load again. A sharded policy cannot be copied whole."""
    import copy

    from ditty._utils.modules import unwrap
    from ditty.config.errors import RecipeError
    from ditty.config.sections import SHARDED_KINDS

    if trainer.config.parallel.kind in SHARDED_KINDS:
        raise RecipeError.single(
            f"rl.beta > 0 needs a reference copy of the model given in Python, which parallel.kind = "
            f'"{trainer.config.parallel.kind}" has sharded',
            key="rl.beta",
            fix='set rl.beta = 0, use parallel.kind = "ddp", or give the model as a path ([model] path=) instead',
        )
    return copy.deepcopy(unwrap(trainer.model))


@torch.no_grad()
def rollout_logps(trainer: Any, which: str, batch: dict, reference: Any) -> torch.Tensor:
    """Token log-probabilities of a rollout micro-batch under the policy (as sampled) or the
    reference, by the same head-input path, temperature and autocast as the training forward."""
    from contextlib import nullcontext

    from ditty.data.generic import to_device

    model = trainer.engine.unwrap(trainer.model)
    inputs = to_device({k: batch[k] for k in ("input_ids", "attention_mask", "labels")}, trainer.runtime.device)
    was_training = model.training
    model.eval()
    try:
        with trainer.precision.autocast():
            if which == "policy":
                return sampled_logps(model, inputs, trainer.config.rl)
            if reference is not None:
                return sampled_logps(reference, inputs, trainer.config.rl)
            with model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext():
                return sampled_logps(model, inputs, trainer.config.rl)
    finally:
        model.train(was_training)


def sampled_logps(model: torch.nn.Module, batch: dict, rl: Any) -> torch.Tensor:
    from ditty.objectives.logprobs import token_logps
    from ditty.stages.fused_loss import emit_head_input, head_projection, output_head
    from ditty.stages.fused_loss.head import model_config

    with emit_head_input(model) as head:
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    projection = sampling_projection(head_projection(output_head(model), model_config(model)), rl)
    return token_logps(head.hidden, projection, batch["labels"])[0]
