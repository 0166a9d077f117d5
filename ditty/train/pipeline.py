"""The micro-batch pipeline: batch -> preprocessors -> model.forward -> postprocessors -> loss.

The `[pipeline]` section names user components as "package.module:Class" plus keyword arguments;
empty, it is the causal-LM default (no processors, `CausalLMLoss`, or with `[train] loss_chunks`
the chunked `FusedLinearCrossEntropyLoss`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ditty._utils.modules import unwrap
from ditty.config.references import import_reference
from ditty.config.sections import ComponentSpec, PipelineConfig
from ditty.contracts.tensors import ContractCheck
from ditty.data.generic import batch_samples
from ditty.metrics.mfu import measure_forward_flops
from ditty.models.inputs import call_model
from ditty.stages.fused_loss import HEAD_INPUT, emit_head_input, wants_head_input


@dataclass
class StageChain:
    """The stages one micro-batch passes through around the model (not the Python API's
    `ditty.Pipeline`, which builds a whole run)."""

    preprocessors: list = field(default_factory=list)
    postprocessors: list = field(default_factory=list)
    loss: Any = None


def import_component(spec: ComponentSpec, key: str) -> Any:
    """Instantiate "package.module:Class" with the spec's kwargs; a bad reference is a RecipeError."""
    return import_reference(spec.use, key=f"{key}.use")(**spec.kwargs)


def build_processors(cfg: PipelineConfig) -> tuple[list, list]:
    """The `[pipeline]` preprocessors and postprocessors."""
    pre = [import_component(s, f"pipeline.preprocessors[{i}]") for i, s in enumerate(cfg.preprocessors)]
    post = [import_component(s, f"pipeline.postprocessors[{i}]") for i, s in enumerate(cfg.postprocessors)]
    return pre, post


def build_loss(cfg: PipelineConfig) -> Any:
    """The `[[pipeline.loss]]` (a weighted sum of several), or None: the objective's loss applies."""
    if not cfg.loss:
        return None
    if len(cfg.loss) == 1:
        return import_component(cfg.loss[0], "pipeline.loss[0]")
    from ditty.stages.loss import CompositeLoss  # weighted sum of several losses

    return CompositeLoss([(import_component(s, f"pipeline.loss[{i}]"), s.weight) for i, s in enumerate(cfg.loss)])


MODEL_OUTPUT = "model_output"
"""Context key of the model's output after the postprocessors (evaluation reads predictions there)."""


def run_pipeline(
    pipeline: StageChain,
    model: torch.nn.Module,
    batch: Any,
    ctx: dict,
    autocast: Callable,
    *,
    lm: bool = True,
    check: bool = False,
) -> Any:
    """One micro-batch through the pipeline; returns the loss calculator's LossOutput.

    Context keys set here (see ditty.processors.Context): "original_batch" before the
    preprocessors, "batch" after them; preprocessors may add "forward_kwargs" for the model.
    Only the model's forward runs under autocast; the loss computes from the output in the
    precision the loss calculator chooses (CausalLMLoss upcasts logits to fp32).
    `check` compares the real tensors of every stage that declares a contract with it (the
    first-step check): a mismatch is a RecipeError naming the stage.
    """
    checker = ContractCheck() if check else None
    with checker.before_a_crash() if checker else nullcontext():
        return _through_stages(pipeline, model, batch, ctx, autocast, lm, checker)


def _through_stages(
    pipeline: StageChain, model: torch.nn.Module, batch: Any, ctx: dict, autocast: Callable, lm: bool, checker: Any
) -> Any:
    ctx["original_batch"] = batch
    for index, processor in enumerate(pipeline.preprocessors):
        before = batch
        batch, ctx = stage_result(processor.process(batch, ctx), "preprocessors", index, processor)
        if checker:
            checker.stage(
                f"pipeline.preprocessors[{index}] ({type(processor).__name__})", processor, before, batch, ctx
            )
    ctx["batch"] = batch
    # A loss that projects the hidden states itself (ditty.fused_loss) gets the output head's input,
    # and the head skips the [tokens, vocab] logits.
    head_input = wants_head_input(pipeline.loss)
    # A custom model's FLOPs for the mfu metric: counted once, on its first training forward.
    flops = measure_forward_flops(unwrap(model), batch_samples(batch)) if not lm and ctx.get("training") else None
    with autocast(), emit_head_input(model) if head_input else nullcontext() as head, flops or nullcontext():
        output = call_model(model, batch, ctx.get("forward_kwargs", {}), lm=lm)
    if head_input:
        ctx[HEAD_INPUT] = head.hidden
    if checker:
        checker.stage(f"model ({type(unwrap(model)).__name__})", unwrap(model), batch, output, ctx)
    for index, processor in enumerate(pipeline.postprocessors):
        before = output
        output, ctx = stage_result(processor.process(output, ctx), "postprocessors", index, processor)
        if checker:
            checker.stage(
                f"pipeline.postprocessors[{index}] ({type(processor).__name__})", processor, before, output, ctx
            )
    if not ctx.get("training"):  # kept only for evaluation: in training it would outlive the step's logits
        ctx[MODEL_OUTPUT] = output
    if checker:
        checker.loss(pipeline.loss, output, ctx)
        checker.raise_errors()
    if head_input:  # its matrix products are the output head's: same precision as in the forward
        with autocast():
            return loss_result(pipeline.loss(output, ctx), pipeline.loss)
    return loss_result(pipeline.loss(output, ctx), pipeline.loss)  # labels reach the loss through ctx["batch"]


def stage_result(result: Any, stages: str, index: int, processor: Any) -> tuple[Any, dict]:
    """A processor's `(data, ctx)`; a RecipeError naming the stage for anything else (a user's stage
    returning its data alone would otherwise fail as an unpacking error far from it)."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        return result
    what = f"{type(result).__name__}{f' of {len(result)}' if isinstance(result, tuple) else ''}"
    raise _stage_error(
        f"pipeline.{stages}[{index}]",
        f"({type(processor).__name__}).process returned {what}: it must return the pair (data, ctx)",
        "end process() with `return batch, ctx` (the context passed on)",
    )


def loss_result(out: Any, loss: Any) -> Any:
    """The loss calculator's LossOutput, checked: a scalar tensor that takes a backward when gradients
    are on, and numeric metrics. A RecipeError naming the loss's class otherwise, before the trainer
    meets it in the backward or the logs."""
    from ditty.stages.loss import LossOutput

    name, fix = type(loss).__name__, "return LossOutput(loss=<a scalar tensor computed from the model's output>)"
    if not isinstance(out, LossOutput):
        raise _stage_error(
            "pipeline.loss", f"{name} returned {type(out).__name__}: a loss calculator returns a LossOutput", fix
        )
    value = out.loss
    if not torch.is_tensor(value) or value.numel() != 1:
        what = f"a tensor of shape {tuple(value.shape)}" if torch.is_tensor(value) else type(value).__name__
        raise _stage_error(
            "pipeline.loss", f"{name} returned a LossOutput whose loss is {what}: it must be a scalar tensor", fix
        )
    if torch.is_grad_enabled() and not value.requires_grad:
        raise _stage_error(
            "pipeline.loss",
            f"{name} returned a loss that does not require grad: it was computed outside autograd (a "
            ".detach(), .item() or torch.no_grad()), so no backward can reach the model",
            fix,
        )
    for key, metric in out.metrics.items():
        if not isinstance(metric, (int, float)) and not (torch.is_tensor(metric) and metric.numel() == 1):
            raise _stage_error(
                "pipeline.loss", f"{name} returned the metric {key!r} = {metric!r}: metrics are numbers", fix
            )
    return out


def _stage_error(key: str, message: str, fix: str) -> Exception:
    """A stage of the user's that returned the wrong thing: a user error (exit code 2 from the CLI)."""
    from ditty.config.errors import RecipeError

    return RecipeError.single(message, key=key, fix=fix)
