"""Compiler rules for user components: `[[pipeline.*]] use = "pkg.mod:Class"` and `[model] factory`.

Order of trust: nothing a recipe names is CALLED before it passes every check here.
1. `pipeline.components`: import the module and look up the attribute (a missing module or name is
   a recipe error); the object must be a class of the slot's type (PreProcessor, PostProcessor,
   LossCalculator); its keyword arguments must bind to its constructor's signature
   (`inspect.signature(...).bind`, nothing is called). `use = "os:system"` is refused here.
2. `model.factory`: a subclass of torch.nn.Module, or a Python function (not a builtin) whose
   return annotation names an nn.Module subclass; `factory_kwargs` must bind. A function without
   a return annotation is refused: the compiler cannot know what it returns without calling it
   (fix: annotate `-> torch.nn.Module`).
3. `pipeline.contracts`: only when everything above passed, the components are constructed (their
   contract may depend on their arguments) and the chain preprocessors -> model (the factory's
   `contract` attribute) -> postprocessors -> loss (with its `output_index`) is checked with
   `ditty.contracts.check_chain`; each problem names its stage.

The same checks serve the Python API (`ditty.pipeline.Pipeline`) through `check_instances`.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from typing import Any, Iterator, Optional

from ditty.config.errors import Problem
from ditty.config.references import resolve_reference
from ditty.contracts import Stage, check_chain
from ditty.recipe.rules import Context, error, rule, warning

SLOTS = {
    "preprocessors": ("ditty.stages.processors", "PreProcessor"),
    "postprocessors": ("ditty.stages.processors", "PostProcessor"),
    "loss": ("ditty.stages.loss", "LossCalculator"),
}
"""Each slot's base class; messages name it as users import it (`from ditty import PreProcessor`)."""
IMAGE_BUILTINS = ("digits",)
"""Built-in non-text datasets (ditty.data.build.IMAGE_BUILTINS): they need a [[pipeline.loss]]."""
BATCH_SPECS = {"digits": "images:4:f32"}
"""What a built-in dataset's batches are, for the contract chain: with the batch known, a stage
that reads a context key nothing provides is an error rather than a warning."""


def _slot_base(slot: str) -> type:
    module, name = SLOTS[slot]
    return getattr(importlib.import_module(module), name)


def check_component(obj: Any, slot: str, key: str, kwargs: dict, reference: str) -> list[Problem]:
    """A class of the slot's type whose constructor accepts `kwargs` (bound, not called)."""
    base = _slot_base(slot)
    if not (isinstance(obj, type) and issubclass(obj, base)):
        what = f"a {type(obj).__name__}" if not isinstance(obj, type) else f"class {obj.__name__}"
        return [
            error(
                key,
                f"{reference} is {what}, not a subclass of ditty.{base.__name__}; refused, never called",
                f"name a class that extends {base.__name__}",
            )
        ]
    if inspect.isabstract(obj):
        return [
            error(
                key,
                f"{reference} is abstract (it does not implement {', '.join(sorted(obj.__abstractmethods__))})",
                "name a concrete subclass",
            )
        ]
    return _bind(obj, kwargs, key + ".kwargs", reference)


def _bind(target: Any, kwargs: dict, key: str, reference: str) -> list[Problem]:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        return [error(key, f"{reference} does not accept these arguments: {exc}", f"match its parameters {signature}")]
    return []


def check_factory(obj: Any, key: str, kwargs: dict, reference: str) -> list[Problem]:
    """An nn.Module class, or a Python function annotated to return one; `kwargs` must bind."""
    import torch

    from ditty.models.registry import ModelSpec

    if isinstance(obj, ModelSpec):  # a spec builds `obj.build` with its config updated by kwargs
        return (
            check_factory(obj.build, key, {**obj.config, **kwargs}, reference)
            if inspect.isfunction(obj.build) or isinstance(obj.build, type)
            else []
        )
    if isinstance(obj, type):
        if not issubclass(obj, torch.nn.Module):
            return [
                error(
                    key,
                    f"{reference} is class {obj.__name__}, not a torch.nn.Module",
                    "name an nn.Module class or a factory function",
                )
            ]
        return _bind(obj, kwargs, "model.factory_kwargs", reference)
    if not inspect.isfunction(obj):
        return [
            error(
                key,
                f"{reference} is a {type(obj).__name__}, not a Python function or nn.Module class; refused, "
                "never called",
                "name a function defined in Python that returns the model",
            )
        ]
    returned = _return_type(obj)
    if returned is None:
        return [
            error(
                key,
                f"{reference} has no return annotation, so the compiler cannot tell that it returns an nn.Module "
                "without calling it",
                f"annotate it: def {obj.__name__}(...) -> torch.nn.Module",
            )
        ]
    if not (isinstance(returned, type) and issubclass(returned, torch.nn.Module)):
        return [
            error(
                key,
                f"{reference} is annotated to return {getattr(returned, '__name__', returned)}, not a torch.nn.Module",
                "return the model instance (an nn.Module)",
            )
        ]
    return _bind(obj, kwargs, "model.factory_kwargs", reference)


def _return_type(function: Any) -> Optional[Any]:
    import torch

    # Resolved in the function's module, with torch and nn available for TYPE_CHECKING-only imports.
    namespace = {**getattr(function, "__globals__", {}), "torch": torch, "nn": torch.nn}
    try:
        hints = typing.get_type_hints(function, globalns=namespace)
    except Exception:  # an annotation that does not resolve: fall back to the raw one
        hints = {"return": function.__annotations__.get("return")} if "return" in function.__annotations__ else {}
    returned = hints.get("return")
    if isinstance(returned, str) or returned is None or returned is type(None):
        return None if returned in (None, type(None)) else returned
    args = [a for a in typing.get_args(returned) if a is not type(None)]  # Optional[Module] / Module | X
    return (
        args[0]
        if typing.get_origin(returned) is typing.Union and len(args) == 1
        else returned
        if not typing.get_origin(returned)
        else None
    )


def contract_of(obj: Any) -> Any:
    return getattr(obj, "contract", None)


def chain_stages(pre: list, model_name: str, model_contract: Any, post: list, loss: Any, loss_name: str) -> list[Stage]:
    """The Stages of a pipeline from (name, instance) lists, in the order they run."""
    stages = [Stage(name, contract_of(p), "preprocessor") for name, p in pre]
    stages.append(Stage(model_name, model_contract, "model"))
    stages += [Stage(name, contract_of(p), "postprocessor") for name, p in post]
    if loss is not None:
        stages += loss_stages(loss, loss_name)
    return stages


def loss_stages(loss: Any, name: str) -> list[Stage]:
    """A loss as Stages: itself, or for a CompositeLoss each part (checked against the same
    producer, with its own output_index), after the composite's own contract when it declares one."""
    parts = getattr(loss, "parts", None)
    if not parts:
        return [Stage(name, contract_of(loss), "loss", getattr(loss, "output_index", 0))]
    own = contract_of(loss)
    stages = [Stage(name, own, "loss", tuple(p.output_index for p, _ in parts))] if own else []
    for index, (part, _) in enumerate(parts):
        stages += loss_stages(part, f"{name} part {index} ({type(part).__name__})")
    return stages


def chain_problems(
    pre: list,
    model_name: str,
    model_contract: Any,
    post: list,
    loss: Any,
    loss_name: str,
    *,
    batch_spec: Any = None,
) -> list[Problem]:
    """check_chain over (name, instance) lists; a CompositeLoss's parts are checked one by one."""
    return check_chain(chain_stages(pre, model_name, model_contract, post, loss, loss_name), batch_spec=batch_spec)


def instance_names(pre: list, model: Any, post: list, loss: Any, *, model_name: Optional[str] = None) -> dict:
    """How the Python API names its stages: by slot, position and class."""
    named = lambda items, slot: [(f"{slot}[{i}] ({type(p).__name__})", p) for i, p in enumerate(items)]  # noqa: E731
    return dict(
        pre=named(pre, "preprocessors"),
        model_name=model_name or f"model ({type(model).__name__})",
        model_contract=contract_of(model),
        post=named(post, "postprocessors"),
        loss=loss,
        loss_name=f"loss ({type(loss).__name__})",
    )


def check_instances(
    pre: list, model: Any, post: list, loss: Any, *, model_name: Optional[str] = None, batch_spec: Any = None
) -> list[Problem]:
    """The contract chain of Python API objects, named by class (used by ditty.pipeline).

    `batch_spec`: what the data yields when known (e.g. the keys of a dict sample): a stage that
    reads a context key no stage provides is then an error, unless the loss finds it in the batch."""
    return chain_problems(**instance_names(pre, model, post, loss, model_name=model_name), batch_spec=batch_spec)


@rule("pipeline.components")
def pipeline_components(ctx: Context) -> Iterator[Problem]:
    """Each `use` imports, is a class of its slot's type, and accepts its kwargs; the factory returns an nn.Module."""
    yield from _components(ctx.config)[1]


@rule("pipeline.contracts")
def pipeline_contracts(ctx: Context) -> Iterator[Problem]:
    """Once every component passed: the stages' contracts chain (preprocessors -> model -> postprocessors -> loss)."""
    cfg = ctx.config
    resolved, problems = _components(cfg)
    if problems:
        return  # reported by pipeline.components; nothing unchecked is called
    if not (cfg.pipeline.preprocessors or cfg.pipeline.postprocessors or cfg.pipeline.loss):
        if cfg.data.source == "builtin" and cfg.data.name in IMAGE_BUILTINS:
            yield error(
                "pipeline.loss",
                f'data.name = "{cfg.data.name}" is not text: the default causal-LM loss cannot train on it',
                'add [[pipeline.loss]] use = "ditty.loss:MSELoss" (and the stages that make its target)',
            )
        return
    instances: dict[str, list] = {}
    for slot in SLOTS:
        instances[slot] = []
        for index, (cls, spec) in enumerate(resolved[slot]):
            key = f"pipeline.{slot}[{index}]"
            try:
                instances[slot].append((f"{key} ({cls.__name__})", cls(**spec.kwargs), spec.weight))
            except Exception as exc:  # the user's constructor rejected its arguments
                yield error(key, f"{spec.use}(**kwargs) failed: {type(exc).__name__}: {exc}", "fix the kwargs")
                return
    loss, loss_name = None, "pipeline.loss"
    if len(instances["loss"]) == 1:
        loss_name, loss, _ = instances["loss"][0]
    elif instances["loss"]:
        from ditty.stages.loss import CompositeLoss

        loss = CompositeLoss([(inst, weight) for _, inst, weight in instances["loss"]])
        loss_name = "pipeline.loss (composite)"
    elif getattr(resolved["factory"], "make_loss", None) and resolved["factory"].loss is not None:
        loss = resolved["factory"].make_loss()  # a model spec's own loss, used when the recipe names none
        loss_name = f"pipeline.loss (the spec's {type(loss).__name__})"
    else:
        from ditty.stages.loss import CausalLMLoss

        loss, loss_name = CausalLMLoss(), "pipeline.loss (default CausalLMLoss)"
    model_contract = contract_of(resolved["factory"]) if resolved["factory"] is not None else None
    model_name = f"model.factory ({cfg.model.factory})" if cfg.model.factory else "model"
    problems = chain_problems(
        [(n, p) for n, p, _ in instances["preprocessors"]],
        model_name,
        model_contract,
        [(n, p) for n, p, _ in instances["postprocessors"]],
        loss,
        loss_name,
        batch_spec=BATCH_SPECS.get(cfg.data.name) if cfg.data.source == "builtin" else None,
    )
    for problem in problems:
        if problem.rule == "contract.unchecked":
            yield warning(problem.key, problem.message, problem.fix)
        else:
            yield problem


def _components(cfg: Any) -> tuple[dict, list[Problem]]:
    """Resolve and check every named component; returns {slot: [(class, spec)], "factory": obj}."""
    problems: list[Problem] = []
    resolved: dict[str, Any] = {"factory": None}
    pipeline = getattr(cfg, "pipeline", None)
    for slot in SLOTS:
        resolved[slot] = []
        for index, spec in enumerate(getattr(pipeline, slot, []) or []):
            key = f"pipeline.{slot}[{index}]"
            obj, found = resolve_reference(spec.use, key=f"{key}.use")
            problems += found
            if obj is None:
                continue
            checked = check_component(obj, slot, f"{key}.use", dict(spec.kwargs), spec.use)
            problems += checked
            if not checked:
                resolved[slot].append((obj, spec))
    if cfg.model.factory:
        obj, found = resolve_reference(cfg.model.factory, key="model.factory")
        problems += found
        if obj is not None:
            checked = check_factory(obj, "model.factory", dict(cfg.model.factory_kwargs), cfg.model.factory)
            problems += checked
            resolved["factory"] = obj if not checked else None
    return resolved, problems


@rule("data.optional-extra")
def image_data_extra(ctx: Context) -> Iterator[Problem]:
    """Built-in image data needs its optional extra (scikit-learn for "digits")."""
    import importlib.util

    data = ctx.config.data
    if data.source == "builtin" and data.name == "digits" and importlib.util.find_spec("sklearn") is None:
        yield error(
            "data.name",
            'data.name = "digits" needs scikit-learn, which is not installed',
            'pip install "ditty[diffusion]" (or pip install scikit-learn)',
        )


BUILTIN_CONVERTERS = {"peft": "the [peft] adapter", "fp8": "the float8 linears of [fp8]"}


@rule("model.converters")
def model_converters(ctx: Context) -> Iterator[Problem]:
    """`model.converters`: known names or importable ModelConverter classes, each once, and every
    configured rewrite listed (an unlisted [peft] or [fp8] would silently not apply)."""
    cfg, key = ctx.config, "model.converters"
    names = list(getattr(cfg.model, "converters", []) or [])
    if not names:
        return
    configured = {"peft": cfg.peft.kind != "none", "fp8": cfg.fp8.enabled}
    for name in sorted({n for n in names if names.count(n) > 1}):
        yield error(key, f"lists {name!r} twice", "list each rewrite once")
    for name in names:
        if name in BUILTIN_CONVERTERS:
            if not configured[name]:
                section = "peft.kind" if name == "peft" else "fp8.enabled"
                yield error(
                    key,
                    f"lists {name!r} but {section} leaves {BUILTIN_CONVERTERS[name]} off",
                    f"set {section}, or remove {name!r} from model.converters",
                )
            continue
        if ":" not in name:
            yield error(
                key,
                f"{name!r} is neither a built-in converter ({', '.join(map(repr, BUILTIN_CONVERTERS))}) "
                'nor "package.module:Class"',
                "use one of those names, or name your converter class",
            )
            continue
        obj, problems = resolve_reference(name, key=key)
        if problems:
            yield from problems
            continue
        if not (isinstance(obj, type) and callable(getattr(obj, "convert", None))):
            yield error(
                key,
                f"{name!r} is not a converter class (a class with convert(model) -> model)",
                "see ditty.models.converters.ModelConverter",
            )
            continue
        yield from _bind(obj, {}, key, name)
    for name, on in configured.items():
        if on and name not in names:
            yield error(
                key,
                f"does not list {name!r}, so {BUILTIN_CONVERTERS[name]} would not apply",
                f"add {name!r} where it belongs in the order, or leave model.converters empty for the default",
            )
