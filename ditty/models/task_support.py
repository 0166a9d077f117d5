"""Which tasks a model architecture can do, known offline and without importing transformers.

The compiler asks `task_problem(model_config, task)` before any weights load. What a model type
can do comes from transformers' own auto mappings (`MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES`
and friends in models/auto/modeling_auto.py): a model type has a task when its mapping lists it.
That file imports the transformers package (about a second, torch included), so its literal tables
are read as text instead (milliseconds), with the import as the fallback.

One refinement: BERT-style encoders (bert, roberta, electra, ...) are listed for causal LM too
(`BertLMHeadModel`), but that class is the encoder run as a decoder: it needs `is_decoder = true` in
the config and its pretrained weights were never trained to predict the next token. Such a model
type, listed for masked LM and not for seq2seq, counts as an encoder: causal-lm needs `is_decoder`.

`new_weight_problems` reads what `from_pretrained` initialised anew, and tells a task head (expected
for a classifier) from anything else (an error: the checkpoint does not fit the architecture).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import json
import os
import re
from typing import Any, Iterable, Iterator, Optional

from ditty.models.source import known_architectures, read_model_config
from ditty.models.tasks import TASKS, ModelTask

_PAIR = re.compile(r'\(\s*"([^"]+)"\s*,\s*"([^"]+)"\s*\)')


@functools.lru_cache(maxsize=None)
def auto_mapping(name: str) -> dict[str, str]:
    """{model_type: class name} of transformers' `name` mapping (e.g. MODEL_FOR_MASKED_LM_MAPPING_NAMES)."""
    spec = importlib.util.find_spec("transformers")
    path = None
    if spec and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "models", "auto", "modeling_auto.py")
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        start = text.find(f"\n{name} = OrderedDict(")
        if start >= 0:
            end = text.find("\n)\n", start)
            return dict(_PAIR.findall(text[start:end]))
    from transformers.models.auto import modeling_auto  # an older layout: pay for the import

    return dict(getattr(modeling_auto, name))


def model_config_with_overrides(model: Any) -> Optional[dict]:
    """config.json of `model.path` (ditty.models.source.read_model_config) with the `model.config`
    overrides on top; for random init from `model.architecture`, {"model_type": architecture} plus the
    overrides; None when it cannot be known offline (an uncached hub id) or for a factory model."""
    if model.factory:
        return None
    if model.path:
        loaded = read_model_config(model)
        return {**loaded, **model.config} if loaded is not None else None
    if model.architecture:
        return {"model_type": model.architecture, **model.config}
    return None


# Model types listed for masked LM that are decoders in their own right (LM heads of their own design).
_NOT_ENCODER_ONLY = frozenset({"xlm", "reformer"})


def is_encoder_only(model_type: str) -> bool:
    """An encoder whose causal-LM class only works as a decoder (see the module doc)."""
    return (
        model_type in auto_mapping(TASKS["masked-lm"].auto_mapping)
        and model_type not in auto_mapping(TASKS["seq2seq"].auto_mapping)
        and model_type not in _NOT_ENCODER_ONLY
    )


def supports(model_config: dict, task: ModelTask) -> bool:
    model_type = model_config.get("model_type")
    if model_type not in auto_mapping(task.auto_mapping):
        return False
    if task.name == "causal-lm" and is_encoder_only(model_type):
        return bool(model_config.get("is_decoder"))
    return True


def supported_tasks(model_config: dict) -> list[str]:
    return [name for name, task in TASKS.items() if supports(model_config, task)]


def task_problem(model_config: Optional[dict], task: ModelTask) -> Optional[tuple[str, str]]:
    """(message, fix) when the architecture cannot do `task`, else None (also when unknown offline,
    or when the model ships its own code: its auto_map decides)."""
    if not model_config or not model_config.get("model_type") or "auto_map" in model_config:
        return None
    if model_config["model_type"] not in known_architectures():  # not transformers' own: unknown here
        return None
    if supports(model_config, task):
        return None
    model_type = model_config["model_type"]
    if task.name == "causal-lm" and is_encoder_only(model_type):
        message = (
            f'{model_type} is an encoder-only model, so it cannot train as model.task = "causal-lm": its '
            "causal-LM class runs the encoder as a decoder (is_decoder = true) and its weights never learned "
            "to predict the next token"
        )
    else:
        message = f'{model_type} has no {task.auto_class} class in transformers (model.task = "{task.name}")'
    others = supported_tasks(model_config)
    if not others:
        return message, "choose a model architecture that transformers builds for this task"
    return (
        f"{message}; {model_type} supports: {', '.join(others)}",
        f"set model.task to one of {', '.join(others)} (and data.format to match)",
    )


def is_head_weight(name: str, base_model_prefix: str) -> bool:
    """Whether a weight belongs to the task head: outside the base model (a classifier, BART's
    classification_head, DeBERTa's pooler), or a pooler inside it (BERT's pooler feeds only the
    sequence classifier and is absent from masked-LM checkpoints)."""
    first = name.split(".", 1)[0]
    return first != base_model_prefix or ".pooler." in f".{name}."


def new_weight_problems(loading_info: dict, base_model_prefix: str, task: ModelTask) -> tuple[list[str], list[str]]:
    """(new head weights, other new weights) from `from_pretrained(..., output_loading_info=True)`:
    missing keys (newly initialised) and mismatched ones (re-initialised at another size)."""
    missing = set(loading_info.get("missing_keys") or ())
    new = sorted(missing | {_name(m) for m in loading_info.get("mismatched_keys") or ()})
    head = [name for name in new if is_head_weight(name, base_model_prefix)]
    return head, [name for name in new if name not in head]


def _name(mismatched: Any) -> str:
    return mismatched[0] if isinstance(mismatched, (tuple, list)) else str(mismatched)


def head_modules(weight_names: Iterable[str]) -> list[str]:
    """The module names that own these weights (for peft's modules_to_save), outermost first."""
    return sorted({name.rsplit(".", 1)[0] for name in weight_names if "." in name}, key=lambda m: (m.count("."), m))


def task_of_saved_model(directory: str) -> Optional[ModelTask]:
    """The task a saved model is for, from its files: config.json's architecture (the class of one
    task's auto mapping), or an adapter's peft task type; None when they do not say. Tasks of one class
    are told apart by the head size (a sequence classifier with one label is a reward model): config.json's
    labels, or an adapter's labels.json."""
    config_file = os.path.join(directory, "config.json")
    adapter_file = os.path.join(directory, "adapter_config.json")
    try:
        if os.path.isfile(config_file):
            with open(config_file, encoding="utf-8") as handle:
                saved = json.load(handle)
            for architecture in saved.get("architectures") or ():
                tasks = [
                    t
                    for t in TASKS.values()
                    if auto_mapping(t.auto_mapping).get(saved.get("model_type")) == architecture
                ]
                if tasks:
                    return _by_head_size(tasks, len(saved.get("id2label") or {}))
        elif os.path.isfile(adapter_file):
            with open(adapter_file, encoding="utf-8") as handle:
                task_type = json.load(handle).get("task_type")
            tasks = [t for t in TASKS.values() if t.peft_task_type and t.peft_task_type == task_type]
            return _by_head_size(tasks, _saved_label_count(directory)) if tasks else None
    except (OSError, ValueError, AttributeError):
        return None
    return None


def _by_head_size(tasks: list[ModelTask], labels: int) -> ModelTask:
    """The task of a fixed head size equal to `labels`, else the first without one."""
    fixed = [task for task in tasks if task.num_labels is not None and task.num_labels == labels]
    return (fixed or [task for task in tasks if task.num_labels is None] or tasks)[0]


def _saved_label_count(directory: str) -> int:
    """num_labels of labels.json beside an adapter of a classifier (ditty.train.final), 0 without one."""
    path = os.path.join(directory, "labels.json")
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as handle:
        return int(json.load(handle).get("num_labels") or 0)


_NEW_HEAD_IS_NEWS: contextvars.ContextVar[bool] = contextvars.ContextVar("new_head_is_news", default=True)


def new_head_is_news() -> bool:
    """Whether a task head the pretrained weights lack starts random (and is announced as such)."""
    return _NEW_HEAD_IS_NEWS.get()


@contextlib.contextmanager
def weights_from_checkpoint() -> Iterator[None]:
    """Builds inside get every weight from a checkpoint afterwards (`ditty export`): a task head the
    pretrained model lacks is then not "randomly initialised", so it is not announced."""
    token = _NEW_HEAD_IS_NEWS.set(False)
    try:
        yield
    finally:
        _NEW_HEAD_IS_NEWS.reset(token)
