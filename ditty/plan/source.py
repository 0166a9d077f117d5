"""Where the planner gets a model's shape, offline and without weights.

In order: a local directory's config.json; a hub id's config.json in the local Hugging Face cache;
the table of well-known public configs (ditty/plan/known.py); for random init, the architecture's
defaults with `model.config` applied. `model.config` overrides apply in every case, as the model
builder applies them. Families the planner knows (ditty/plan/architecture.py) are inventoried by
arithmetic; any other Hugging Face architecture, and custom `model.factory` models, are built on
the meta device (torch and transformers are imported then: seconds, never weights).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ditty.config.errors import RecipeError
from ditty.models.source import cached_hub_file, local_model_dir, looks_like_hub_id
from ditty.plan.architecture import CONFIG_DEFAULTS, FAMILIES, ModelShape, inventory_from_module
from ditty.plan.known import known_config

BYTE_TOKENIZER_SIZE = 259
"""Tokens of ditty's built-in byte tokenizer (3 special tokens and 256 bytes): the vocabulary of a
random-init model trained with it (the trainer sizes the embedding from the tokenizer)."""


def model_shape(config: Any) -> ModelShape:
    """The shape of the model a recipe builds, `[mtp]` heads included; a RecipeError when it cannot be
    known offline."""
    from ditty.plan.mtp import with_heads

    shape = _trunk_shape(config)
    return with_heads(shape, config.mtp.depth) if not config.model.factory else shape


def _trunk_shape(config: Any) -> ModelShape:
    model = config.model
    if model.factory:
        return _factory_shape(model)
    values, source = _config_values(model)
    values = {**values, **model.config}
    if model.resolved_init == "random" and _uses_byte_tokenizer(config):
        values["vocab_size"] = BYTE_TOKENIZER_SIZE
        source += ", vocabulary of the byte tokenizer"
    if values.get("model_type") in FAMILIES:
        return ModelShape.from_config(values, source=source)
    return _meta_shape(values, source, trust_remote_code=model.trust_remote_code, task=model.task)


def _config_values(model: Any) -> tuple[dict[str, Any], str]:
    if model.path:
        local = local_model_dir(model.path)
        if local:
            return _read_json(os.path.join(local, "config.json")), f"config.json of {model.path}"
        if looks_like_hub_id(model.path):
            cached = cached_hub_file(model.path)
            if cached:
                return _read_json(cached), f"config.json of {model.path} (Hugging Face cache)"
            known = known_config(model.path)
            if known is not None:
                return known, f"public config of {model.path} from ditty's table of known models"
        raise RecipeError.single(
            f"cannot plan {model.path!r} offline: it is not a local directory, not in the Hugging Face cache "
            "and not one of the well-known models ditty knows",
            key="model.path",
            fix="download its config first (`hf download ID config.json`), or point model.path at a local "
            "directory holding config.json",
        )
    architecture = model.architecture or "llama"
    return {"model_type": architecture, **CONFIG_DEFAULTS.get(architecture, {})}, f"{architecture} defaults"


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        raise RecipeError.single(f"cannot read {path}: {error}", key="model.path") from None


def _uses_byte_tokenizer(config: Any) -> bool:
    tokenizer = getattr(config, "tokenizer", None)
    return tokenizer is not None and tokenizer.source(config.model) is None


def _meta_shape(values: dict[str, Any], source: str, *, trust_remote_code: bool, task: str) -> ModelShape:
    """Any other Hugging Face architecture: the model task's class of it built on the meta device."""
    import torch
    from transformers import AutoConfig

    from ditty.models.tasks import model_task, transformers_class

    model_type = values.pop("model_type", None)
    if not model_type:
        raise RecipeError.single(f"{source} names no model_type", key="model.path")
    try:
        hf_config = AutoConfig.for_model(model_type, **{k: v for k, v in values.items() if not k.startswith("_")})
        with torch.device("meta"):
            built = transformers_class(model_task(task)).from_config(hf_config, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, TypeError) as error:
        raise RecipeError.single(
            f"cannot build a {model_type} model on the meta device to plan it: {error}", key="model.path"
        ) from None
    return inventory_from_module(
        built, source=f"{source}, built on the meta device", checkpoint_dtype=values.get("torch_dtype")
    )


def _factory_shape(model: Any) -> ModelShape:
    """A custom model: the factory's module built on the meta device (no weights are allocated)."""
    import torch

    from ditty.models.factory import build_from_factory

    with torch.device("meta"):
        built = build_from_factory(model.factory, model.factory_kwargs)
    return inventory_from_module(built, source=f"{model.factory}, built on the meta device")
