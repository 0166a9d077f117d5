"""The micro-batch pipeline: batch -> preprocessors -> model.forward -> postprocessors -> loss.

The `[pipeline]` section names user components as "package.module:Class" plus keyword arguments;
empty, it is the causal-LM default (no processors, `CausalLMLoss`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ditty.config.errors import RecipeError
from ditty.config.sections import ComponentSpec, PipelineConfig

# Keys of a batch the model's forward takes. Everything else (labels, user keys) stays for the loss:
# passing labels would make Hugging Face models compute a second, unwanted loss over the logits.
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds")


@dataclass
class Pipeline:
    preprocessors: list = field(default_factory=list)
    postprocessors: list = field(default_factory=list)
    loss: Any = None


def import_component(spec: ComponentSpec, key: str) -> Any:
    """Instantiate "package.module:Class" with the spec's kwargs; a bad reference is a RecipeError."""
    module_name, _, attr = spec.use.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise RecipeError.single(f"cannot import {spec.use!r}: {exc}", key=key, fix='use "package.module:Class"') from exc
    return cls(**spec.kwargs)


def build_pipeline(cfg: PipelineConfig) -> Pipeline:
    from ditty.loss import CausalLMLoss

    pre = [import_component(s, f"pipeline.preprocessors[{i}]") for i, s in enumerate(cfg.preprocessors)]
    post = [import_component(s, f"pipeline.postprocessors[{i}]") for i, s in enumerate(cfg.postprocessors)]
    if not cfg.loss:
        loss = CausalLMLoss()
    elif len(cfg.loss) == 1:
        loss = import_component(cfg.loss[0], "pipeline.loss[0]")
    else:
        from ditty.loss import CompositeLoss  # weighted sum of several losses

        loss = CompositeLoss([(import_component(s, f"pipeline.loss[{i}]"), s.weight) for i, s in enumerate(cfg.loss)])
    return Pipeline(pre, post, loss)


def model_inputs(model: torch.nn.Module, batch: dict) -> dict:
    """The forward's keyword arguments; `use_cache=False` for Hugging Face models (training, and
    packed samples are isolated only without a cache)."""
    kwargs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    if getattr(getattr(model, "config", None), "use_cache", None) is not None:
        kwargs["use_cache"] = False
    return kwargs


def run_pipeline(pipeline: Pipeline, model: torch.nn.Module, batch: dict, ctx: dict, autocast: Callable) -> Any:
    """One micro-batch through the pipeline; returns the loss calculator's LossOutput.

    Context keys set here (see ditty.processors.Context): "original_batch" before the
    preprocessors, "batch" after them; preprocessors may add "forward_kwargs" for the model.
    Only the model's forward runs under autocast; the loss computes from the output in the
    precision the loss calculator chooses (CausalLMLoss upcasts logits to fp32).
    """
    ctx["original_batch"] = batch
    for processor in pipeline.preprocessors:
        batch, ctx = processor.process(batch, ctx)
    ctx["batch"] = batch
    with autocast():
        output = model(**model_inputs(model, batch), **ctx.get("forward_kwargs", {}))
    for processor in pipeline.postprocessors:
        output, ctx = processor.process(output, ctx)
    return pipeline.loss(output, ctx)  # labels reach the loss through ctx["batch"]
