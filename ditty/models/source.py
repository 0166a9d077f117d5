"""Where a model comes from, checked without the network and without importing torch.

`ditty check` calls `check_model_source` for every recipe, so everything here must stay cheap:
no torch, no transformers package import (about a second), no HTTP. A hub id that is
not in the local Hugging Face cache cannot be verified offline; that is a warning, never an error
(`ditty check` never touches the network). The build step (`build_model`) turns a real failure into a RecipeError.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import os
from typing import Optional

from ditty.config.errors import Problem
from ditty.config.sections import ModelConfig


def looks_like_hub_id(path: str) -> bool:
    """Hub ids are "name" or "org/name"; more slashes, or a leading "/", "." or "~", make a path."""
    return path.count("/") <= 1 and not path.startswith((".", "/", "~")) and "\\" not in path


def local_model_dir(path: str) -> Optional[str]:
    """The expanded local directory `path` names, or None when no such directory exists."""
    expanded = os.path.expanduser(path)
    return expanded if os.path.isdir(expanded) else None


def cached_hub_file(repo_id: str, filename: str = "config.json") -> Optional[str]:
    """Path of `filename` of `repo_id` in the local Hugging Face cache, if it was downloaded before."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = try_to_load_from_cache(repo_id, filename)
    except HFValidationError:  # not a valid repo id at all
        return None
    return found if isinstance(found, str) else None


def read_model_type(model: ModelConfig) -> Optional[str]:
    """The transformers `model_type` a recipe builds, found offline (for compiler rules such as packing).

    Read from `config.json` of a local directory or of a cached hub model, else `model.architecture`.
    None when it cannot be known without the network, or for custom (`factory`) models.
    """
    if model.factory:
        return None
    if model.path:
        return (read_model_config(model) or {}).get("model_type")
    return model.architecture


def read_model_config(model: ModelConfig) -> Optional[dict]:
    """The `config.json` of `model.path` (a local directory or a cached hub model) as a dict, or None
    when there is no path or it cannot be read offline. `model.config` overrides are not applied."""
    if model.factory or not model.path:
        return None
    local = local_model_dir(model.path)
    config_file = os.path.join(local, "config.json") if local else None
    if config_file is None and looks_like_hub_id(model.path):
        config_file = cached_hub_file(model.path)
    if not config_file or not os.path.isfile(config_file):
        return None
    try:
        with open(config_file, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


@functools.lru_cache(maxsize=1)
def known_architectures() -> frozenset[str]:
    """Every `model_type` transformers' AutoConfig knows.

    transformers keeps these names in a generated, dependency-free file (models/auto/auto_mappings.py).
    Loading that file on its own takes milliseconds; importing it through the transformers package
    costs about 0.9 s and importing CONFIG_MAPPING pulls in torch (3 s). Older releases without the
    file fall back to CONFIG_MAPPING.
    """
    spec = importlib.util.find_spec("transformers")
    mapping_file = None
    if spec and spec.submodule_search_locations:
        candidate = os.path.join(list(spec.submodule_search_locations)[0], "models", "auto", "auto_mappings.py")
        mapping_file = candidate if os.path.isfile(candidate) else None
    if mapping_file:
        module_spec = importlib.util.spec_from_file_location("_ditty_transformers_auto_mappings", mapping_file)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return frozenset(module.CONFIG_MAPPING_NAMES)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return frozenset(CONFIG_MAPPING_NAMES)


def did_you_mean(value: str, choices, *, what: str = "") -> str:
    """A fix hint naming the closest choice, or an empty string when nothing is close."""
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return f'did you mean "{close[0]}"?' if close else what


def check_model_source(model: ModelConfig) -> list[Problem]:
    """Problems with the `[model]` section's source, found offline and without torch.

    Errors: a local path that does not exist or holds no config.json; random init with neither
    `path` nor `architecture`; pretrained init without `path`; an unknown `architecture`.
    Warnings: a hub id that is not in the local cache (it cannot be verified offline); options the
    chosen way of building ignores. `model.factory` itself is checked by the pipeline rules.
    """
    if model.factory:
        ignored = [name for name in ("path", "architecture") if getattr(model, name)]
        return [
            Problem(
                key=f"model.{name}",
                message="is ignored because `model.factory` builds the model",
                fix=f"remove model.{name}, or remove model.factory",
                severity="warning",
            )
            for name in ignored
        ]

    problems: list[Problem] = []
    if model.path:
        problems.extend(_check_path(model.path))
        if not problems and model.resolved_init == "pretrained":
            problems.extend(weights_problems(model.path, "model.path"))
    elif model.resolved_init == "pretrained":
        problems.append(
            Problem(
                key="model.path",
                message="is required to load a pretrained model",
                fix='set model.path to a local directory or a hub id (org/name), or use model.init = "random"',
            )
        )
    elif not model.architecture:
        problems.append(
            Problem(
                key="model.architecture",
                message="random init needs an architecture: neither `model.path` nor `model.architecture` is set",
                fix='set model.architecture (e.g. "llama") or model.path to a model whose config to use',
            )
        )

    if model.architecture:
        problems.extend(_check_architecture(model))
    return problems


def frozen_model_problems(path: str, key: str, role: str) -> list[Problem]:
    """What can be told offline of a frozen model named by `path` at recipe key `key` (a preference
    reference, a distillation teacher): that it is a model directory or a hub id, as model.path is
    checked, and that its architecture and its weights' class are a causal LM's (from its config.json;
    an uncached hub id is checked when it loads). `role` names it in the message: "reference", "teacher"."""
    from dataclasses import replace

    from ditty.models.task_support import task_problem
    from ditty.models.tasks import model_task

    found = [replace(problem, key=key) for problem in _check_path(path)]
    if found:
        return found
    found = weights_problems(path, key)
    if found:
        return found
    config = read_model_config(ModelConfig(path=path))
    owner = "student" if role == "teacher" else "policy"
    if task_problem(config, model_task("causal-lm")):
        return [
            Problem(
                key=key,
                message=f"{path!r} is a {config['model_type']} model that is not a causal LM: the {role} scores the "
                "next token of every completion with a causal LM's head",
                fix=f"name a causal LM trained with the {owner}'s tokenizer",
            )
        ]
    head = headless_architecture(config)
    if head:  # a causal LM's model type with another head: a classifier's, a reward model's, or none
        return [
            Problem(
                key=key,
                message=f"{path!r} is a {head} (its config.json's architectures), not a causal LM: the {role} "
                "scores the next token of every completion with a causal LM's output head, which it does not "
                "have (loading it as one gives that head random weights)",
                fix=f"name a causal LM trained with the {owner}'s tokenizer (a reward model's final/ scores whole "
                "answers: use it in rl.rewards)",
            )
        ]
    return []


EMBEDDINGS = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "embed_in.weight",
    "tok_embeddings.weight",
    "shared.weight",
    "lm_head.weight",
    "embed_out.weight",
)
"""How transformers' models name their token embeddings and output heads: one row per token id."""


def weights_problems(path: str, key: str) -> list[Problem]:
    """A local model directory whose config.json and safetensors weights disagree on the vocabulary:
    an embedding or output head with another row count than `vocab_size` (an edited config, weights
    of another model). Read from the files' headers, nothing loaded; [] when it cannot be told."""
    local = local_model_dir(path)
    config = read_model_config(ModelConfig(path=path)) if local else None
    if not config:
        return []
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    vocab_size = text.get("vocab_size", config.get("vocab_size"))
    if not isinstance(vocab_size, int):
        return []
    for name, shape in _embedding_shapes(local):
        if len(shape) == 2 and shape[0] != vocab_size:
            return [
                Problem(
                    key=key,
                    message=f"{path!r} does not fit its own config.json: vocab_size = {vocab_size}, and its weights' "
                    f"{name} has {shape[0]} rows (one per token id), so it cannot load",
                    fix=f"set vocab_size to {shape[0]} in {os.path.join(path, 'config.json')} if the weights are "
                    "right, or save the model again with save_pretrained",
                )
            ]
    return []


def _embedding_shapes(directory: str) -> list[tuple[str, list]]:
    """(name, shape) of the embeddings and output heads in a directory's safetensors files, from their
    JSON headers (a few KB each), the index's shard for each when the weights are sharded."""
    index_file = os.path.join(directory, "model.safetensors.index.json")
    wanted: dict[str, str] = {}
    try:
        if os.path.isfile(index_file):
            with open(index_file, encoding="utf-8") as handle:
                weight_map = json.load(handle).get("weight_map", {})
            wanted = {n: f for n, f in weight_map.items() if isinstance(f, str) and n.endswith(EMBEDDINGS)}
        elif os.path.isfile(os.path.join(directory, "model.safetensors")):
            wanted = {"": "model.safetensors"}
        shapes = []
        for file in sorted(set(wanted.values())):
            header = _safetensors_header(os.path.join(directory, file))
            shapes += [
                (name, entry.get("shape"))
                for name, entry in header.items()
                if name.endswith(EMBEDDINGS) and isinstance(entry, dict) and isinstance(entry.get("shape"), list)
            ]
        return shapes
    except (OSError, ValueError, AttributeError):  # unreadable or damaged: loading says what is wrong
        return []


def _safetensors_header(path: str) -> dict:
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if not 0 < length <= 100_000_000:
            raise ValueError(f"not a safetensors header length: {length}")
        return json.loads(handle.read(length))


CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
"""How transformers names the classes with a next-token head (LlamaForCausalLM, GPT2LMHeadModel, ...)."""
OTHER_HEADS = (
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMaskedLM",
    "ForMultipleChoice",
    "Model",
)
"""Classes without one: a classifier's or a reward model's head, a masked LM's, or none (LlamaModel)."""


def headless_architecture(config: Optional[dict]) -> Optional[str]:
    """The class a config.json says its weights are, when none has a next-token head (a reward
    model's LlamaForSequenceClassification), else None (also when it names none or unknown ones)."""
    names = (config or {}).get("architectures")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return None
    if any(name.endswith(CAUSAL_HEADS) for name in names):
        return None
    return names[0] if all(name.endswith(OTHER_HEADS) for name in names) else None


def _check_path(path: str) -> list[Problem]:
    local = local_model_dir(path)
    if local:
        if not os.path.isfile(os.path.join(local, "config.json")):
            return [
                Problem(
                    key="model.path",
                    message=f"directory {path!r} holds no config.json, so it is not a Hugging Face model",
                    fix="point it at a directory written by save_pretrained, or at a hub id",
                )
            ]
        return []
    if os.path.exists(os.path.expanduser(path)):
        return [
            Problem(
                key="model.path",
                message=f"{path!r} is a file, not a model directory",
                fix="point it at the directory that holds config.json",
            )
        ]
    if not looks_like_hub_id(path):
        return [
            Problem(
                key="model.path",
                message=f"local directory {path!r} does not exist",
                fix="check the path (relative paths start from the current directory), or use a hub id such "
                "as org/name",
            )
        ]
    invalid = invalid_hub_id_reason(path)
    if invalid:
        return [
            Problem(
                key="model.path",
                message=f"{path!r} is neither a local directory nor a valid hub id ({invalid})",
                fix="check the path, or write the hub id as org/name",
            )
        ]
    if cached_hub_file(path):
        return []
    return [
        Problem(
            key="model.path",
            message=f"hub id {path!r} cannot be verified offline (no local directory has that name and it is "
            "not in the Hugging Face cache)",
            fix="it is fetched when the run starts; to check it now, download it first (`hf download ID`)",
            severity="warning",
        )
    ]


def invalid_hub_id_reason(path: str) -> str:
    """Why huggingface_hub would refuse `path` as a repo id (bad characters, "--"), or ""."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(path)
    except HFValidationError as error:
        return str(error).strip().splitlines()[0]
    return ""


def _check_architecture(model: ModelConfig) -> list[Problem]:
    if model.path:
        return [
            Problem(
                key="model.architecture",
                message="is ignored because `model.path` gives the architecture",
                fix="remove one of model.architecture and model.path",
                severity="warning",
            )
        ]
    if model.resolved_init == "pretrained":
        return [
            Problem(
                key="model.architecture",
                message='only applies to model.init = "random"',
                fix='set model.init = "random", or set model.path to the pretrained model',
                severity="warning",
            )
        ]
    architectures = known_architectures()
    if model.architecture in architectures:
        return []
    return [
        Problem(
            key="model.architecture",
            message=f"unknown architecture {model.architecture!r} (not a transformers model type)",
            fix=did_you_mean(
                model.architecture,
                architectures,
                what='use a model type such as "llama", "mistral", "qwen2" or "gpt_neox"',
            ),
        )
    ]
