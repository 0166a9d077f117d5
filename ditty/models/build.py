"""Building the model a `[model]` section describes: pretrained weights, a fresh architecture, or a factory.

Every user mistake that only shows at build time (a path that vanished, a hub id that cannot be
fetched, an unknown config override) becomes a RecipeError naming the key, so `ditty run` exits
with code 2 and a fix instead of a traceback. Seeding is the caller's job: random init draws from
torch's global generator as it stands.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ditty._utils.dist import is_main_process
from ditty.config.errors import RecipeError
from ditty.config.sections import ModelConfig, QuantConfig
from ditty.models.factory import build_from_factory
from ditty.models.source import check_model_source, did_you_mean, local_model_dir
from ditty.models.tasks import model_task, transformers_class

log = logging.getLogger("ditty.models")

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


def build_model(
    model: ModelConfig,
    *,
    tokenizer: "Optional[PreTrainedTokenizerBase]" = None,
    device="cpu",
    quant: Optional[QuantConfig] = None,
    labels: Optional[Sequence[str]] = None,
) -> "torch.nn.Module":
    """The model of the recipe, on `device`, in the dtype `model.dtype` resolves to.

    The transformers class is `model.task`'s Auto class (ditty/models/tasks.py). `labels`: the label
    names in id order, for tasks whose data defines them (a classifier's num_labels, id2label and
    label2id are set from them, so they are saved with the model).

    With a tokenizer, a random-init model takes its vocabulary size and special-token ids from it,
    and a pretrained model's embeddings grow when the tokenizer has more tokens than the checkpoint.
    With `quant` (kind other than "none"), pretrained weights load quantized by bitsandbytes
    (ditty/models/quant.py), placed on `device` as they load. They are not frozen here: the
    adapter converter (ditty/models/adapters.py) that every quantized recipe needs freezes them.
    Quantizing a random init or a factory model is refused.
    """
    import torch

    from ditty.models.quant import is_quantized  # cheap: no bitsandbytes import

    device = torch.device(device)
    if is_quantized(quant):
        if model.factory or model.resolved_init == "random":
            raise RecipeError.single(
                "quantized loading needs pretrained Hugging Face weights: random or factory weights quantized "
                "to 4 or 8 bits and then frozen would leave only the adapter to learn, on top of noise",
                key="quant.kind",
                fix='set quant.kind = "none", or load a pretrained model (model.path with model.init = "pretrained")',
            )
        from ditty.models.quant import keep_4bit_layout_fixed

        # bitsandbytes places the quantized weights itself (device_map); moving an 8-bit model
        # afterwards with `.to` is refused by transformers.
        return keep_4bit_layout_fixed(_load_pretrained(model, tokenizer, device, quant=quant, labels=labels))
    if model.factory:
        built = build_from_factory(model.factory, model.factory_kwargs)
        if model.dtype != "auto":
            built = built.to(getattr(torch, model.dtype))
        return built.to(device)
    if model.resolved_init == "random":
        built = _build_random(model, tokenizer, device, labels)
    else:
        built = _load_pretrained(model, tokenizer, device, labels=labels)
    return built.to(device)


def label_config(labels: Optional[Sequence[str]], task: Optional[str] = None) -> dict[str, Any]:
    """Config values for a label set: id2label and label2id (transformers derives num_labels); without
    one, the task's fixed head size (a reward model's num_labels = 1)."""
    if not labels:
        fixed = model_task(task).num_labels if task is not None else None
        return {"num_labels": fixed} if fixed is not None else {}
    return {"id2label": dict(enumerate(labels)), "label2id": {name: index for index, name in enumerate(labels)}}


def _load_pretrained(
    model: ModelConfig,
    tokenizer,
    device: "torch.device",
    quant: Optional[QuantConfig] = None,
    labels: Optional[Sequence[str]] = None,
) -> "torch.nn.Module":
    from ditty.models.quant import bnb_config, is_quantized

    if not model.path:
        raise RecipeError.single(
            "is required to load a pretrained model",
            key="model.path",
            fix='set model.path to a local directory or a hub id (org/name), or use model.init = "random"',
        )
    task = model_task(model.task)
    source, config = hf_config(model, label_config(labels, model.task))
    # "auto" on CPU means fp32: bf16/fp16 matmuls crawl on most CPUs (0.3 vs 120 GFLOP/s here).
    dtype = resolve_dtype(model.dtype, device, default_accelerator="auto")
    extra = attention_kwargs(model)
    if is_quantized(quant):
        extra["quantization_config"] = bnb_config(quant)
        extra["device_map"] = {"": device.index if device.type == "cuda" and device.index is not None else device.type}
    if task.labels or task.num_labels is not None:
        extra["ignore_mismatched_sizes"] = True  # a classifier checkpoint with another label count: a new head
    loaded, info = _fetching(
        lambda: transformers_class(task).from_pretrained(
            source,
            config=config,
            dtype=dtype,
            trust_remote_code=model.trust_remote_code,
            output_loading_info=True,
            **extra,
        ),
        model.path,
    )
    check_new_weights(loaded, info, model)
    if tokenizer is not None:
        _fit_to_tokenizer(loaded, tokenizer)
    return loaded


def check_new_weights(loaded: "torch.nn.Module", info: dict, model: ModelConfig) -> None:
    """A pretrained load must bring every weight except the task head's: a new head (a classifier on a
    pretrained encoder) is reported; any other newly initialised weight means the checkpoint does not
    fit the task's architecture, and is an error (it would train from random values unnoticed)."""
    from ditty.models.task_support import new_head_is_news, new_weight_problems

    task = model_task(model.task)
    head, other = new_weight_problems(info, getattr(loaded, "base_model_prefix", ""), task)
    if other:
        shown = ", ".join(other[:6]) + (f" and {len(other) - 6} more" if len(other) > 6 else "")
        raise RecipeError.single(
            f"{model.path!r} lacks weights that {type(loaded).__name__} needs beyond its task head, so they would "
            f"start random: {shown}",
            key="model.path",
            fix=f"check model.task (now {task.name!r}) against what the checkpoint was trained for, or point "
            "model.path at a complete checkpoint",
        )
    if head and is_main_process() and new_head_is_news():
        log.warning(
            "new task head for %s (randomly initialised, trained from here): %s",
            task.name,
            ", ".join(head[:8]) + (f" and {len(head) - 8} more" if len(head) > 8 else ""),
        )
    loaded.ditty_new_head = tuple(head)  # the adapter converter trains these fully (modules_to_save)


def _build_random(
    model: ModelConfig, tokenizer, device: "torch.device", labels: Optional[Sequence[str]] = None
) -> "torch.nn.Module":
    task = model_task(model.task)
    defaults = {**(_tokenizer_config(tokenizer) if tokenizer is not None else {}), **label_config(labels, model.task)}
    _, config = hf_config(model, defaults)
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        # T5's convention, which the decoder needs to shift labels right; set only when the config has none.
        config.decoder_start_token_id = config.pad_token_id
    if tokenizer is not None and config.vocab_size < len(tokenizer):
        raise RecipeError.single(
            f"vocab_size = {config.vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens",
            key="model.config.vocab_size",
            fix=f"remove the override or set it to at least {len(tokenizer)}",
        )
    dtype = resolve_dtype(model.dtype, device, default_accelerator=config.dtype or "float32")
    try:
        return transformers_class(task).from_config(
            config, dtype=dtype, trust_remote_code=model.trust_remote_code, **attention_kwargs(model)
        )
    except ValueError as error:  # transformers' word for "no class of this task for this model type"
        raise RecipeError.single(
            f"cannot build {task.noun} ({task.auto_class}) from this configuration: {_summary(error)}",
            key="model.path" if model.path else "model.architecture",
            fix="choose an architecture that has this task (see the compiler's rule model.task), or change model.task",
        ) from error


def hf_config(model: ModelConfig, defaults: dict[str, Any]) -> "tuple[Optional[str], PretrainedConfig]":
    """The transformers config of `model.path` (or of `model.architecture`), built with `defaults`
    then, for a random init, `model.config` as constructor arguments; also the resolved source to
    load weights from.

    Overrides go to the constructor, never set as attributes afterwards: that would leave derived
    fields stale (Llama computes head_dim from hidden_size / num_attention_heads in its constructor).
    """
    from transformers import AutoConfig

    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # huggingface_hub before strict dataclasses: configs were not validated
        StrictDataclassError = ValueError

    # The compiler's checks of model.path and model.architecture, again: the directory may have gone since.
    errors = [problem for problem in check_model_source(model) if problem.severity == "error"]
    if errors:
        raise RecipeError(errors)
    if model.path:
        source = local_model_dir(model.path) or model.path

        def make(**values):
            return _fetching(
                lambda: AutoConfig.from_pretrained(source, trust_remote_code=model.trust_remote_code, **values),
                model.path,
            )

    elif model.architecture:
        source = None

        def make(**values):
            return AutoConfig.for_model(model.architecture, **values)

    else:
        raise RecipeError.single(
            "random init needs an architecture: neither `model.path` nor `model.architecture` is set",
            key="model.architecture",
            fix='set model.architecture (e.g. "llama") or model.path',
        )
    config = make()
    # A pretrained model is its checkpoint: `model.config` shapes a random init only (the compiler warns
    # that it has no effect here), so a recipe's sizes never meet weights of another size.
    overrides = dict(model.config) if model.resolved_init == "random" else {}
    _check_override_keys(config, overrides)
    values = {**defaults, **overrides}
    if not values:
        return source, config
    try:
        return source, make(**values)
    except (ValueError, TypeError, StrictDataclassError) as error:
        # transformers 5 validates configs on construction (types, heads dividing the width).
        raise RecipeError.single(
            f"invalid {config.model_type} configuration: {_summary(error)}",
            key="model.config",
            fix="check the sizes and types in model.config",
        ) from error


def _fetching(load, path: str):
    """Run a transformers loader; turn "cannot find / fetch it" into a RecipeError on `model.path`.

    transformers raises OSError for a missing repo, a missing file and an offline cache miss alike
    (huggingface_hub's own errors, LocalEntryNotFoundError included, derive from OSError), and its
    message says which, so its first line is passed on. A damaged safetensors file (safetensors'
    own error) is a RecipeError too.
    """
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - transformers depends on safetensors
        SafetensorError = OSError
    unreachable = hub_out_of_reach(path)
    try:
        if unreachable:  # the cache is used as it is, a missing file fails at once (no minute of retries)
            from ditty.metrics.hub_offline import offline_switch

            with offline_switch():
                return load()
        return load()
    except SafetensorError as error:  # a truncated or corrupted weights file (not an OSError)
        raise RecipeError.single(
            f"the weights in {path!r} are damaged: {_summary(error)}",
            key="model.path",
            fix="save or download the checkpoint again (an interrupted copy leaves a truncated file)",
        ) from error
    except OSError as error:
        if local_model_dir(path):
            raise RecipeError.single(
                f"cannot load a model from directory {path!r}: {_summary(error)}",
                key="model.path",
                fix="point it at a directory written by save_pretrained (config.json and weights)",
            ) from error
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
        why = f" (the Hub at {unreachable} cannot be reached)" if unreachable else " (HF_HUB_OFFLINE is set)"
        raise RecipeError.single(
            f"model {path!r} could not be fetched from the Hugging Face Hub"
            + (why if unreachable or offline else "")
            + f": {_summary(error)}",
            key="model.path",
            fix="download it first (`hf download ID`) or set model.path to a local directory; check the id's spelling",
        ) from error


def hub_out_of_reach(path: str) -> Optional[str]:
    """The Hub's address when `path` would be fetched from it (no local directory, offline mode off)
    and one connection to it fails (a few seconds at most), else None: huggingface_hub would retry
    each file for a minute before saying the same."""
    if local_model_dir(path):
        return None
    from ditty.metrics.hub_offline import already_offline, hub_endpoint, hub_reachable

    if already_offline():
        return None
    endpoint = hub_endpoint()
    asked, reachable = _HUB_PROBES.get(endpoint, (-1e9, True))
    if time.monotonic() - asked > 60:  # one probe serves the loads of a minute (config, tokenizer, weights)
        reachable = hub_reachable(endpoint)
        _HUB_PROBES[endpoint] = (time.monotonic(), reachable)
    return None if reachable else endpoint


_HUB_PROBES: dict[str, tuple[float, bool]] = {}


LEGACY_ROPE_KEYS = frozenset({"rope_theta", "rope_scaling"})
"""Keys every Llama-style config.json of transformers 4 has; transformers 5 takes them as keywords and
keeps them in `rope_parameters` (so they are not attributes, but not misspellings either)."""


def _check_override_keys(config: "PretrainedConfig", overrides: dict[str, Any]) -> None:
    """Refuse `model.config` keys the config class does not have: config classes accept any keyword
    silently, so a misspelled key would otherwise be dropped."""
    known = set(config.to_dict()) | set(getattr(config, "attribute_map", {}))
    # Fields kept as properties (num_labels, the size of id2label) are left out of to_dict().
    properties = {name: value for cls in type(config).__mro__ for name, value in vars(cls).items()}
    known |= {name for name, value in properties.items() if isinstance(value, property) and value.fset is not None}
    if "rope_parameters" in known:  # transformers 5 folds the config.json keys of before into rope_parameters
        known |= LEGACY_ROPE_KEYS
    unknown = sorted(key for key in overrides if key not in known)
    if unknown:
        raise RecipeError.single(
            f"unknown {config.model_type} config field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}",
            key=f"model.config.{unknown[0]}",
            fix=did_you_mean(unknown[0], known, what=f"see the fields of {type(config).__name__}"),
        )


def config_key_problems(model: ModelConfig) -> list:
    """The compiler's view of `_check_override_keys`: unknown `model.config` keys of a random init,
    found from the architecture's config class or a local model's config.json (nothing fetched)."""
    if not model.config or model.factory or model.resolved_init != "random":
        return []
    from transformers import AutoConfig

    local = local_model_dir(model.path) if model.path else None
    try:
        if local:
            config = AutoConfig.from_pretrained(local, trust_remote_code=model.trust_remote_code)
        elif model.architecture and not model.path:
            config = AutoConfig.for_model(model.architecture)
        else:
            return []  # a hub id: `ditty run` checks the keys once it has the config
        _check_override_keys(config, model.config)
    except RecipeError as error:
        return list(error.problems)
    except Exception:  # noqa: BLE001 - an unknown architecture or unreadable config is model.source's to report
        return []
    return []


def _tokenizer_config(tokenizer) -> dict[str, Any]:
    values = {"vocab_size": len(tokenizer)}
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        token_id = getattr(tokenizer, name, None)
        if token_id is not None:
            values[name] = token_id
    return values


def _fit_to_tokenizer(model: "torch.nn.Module", tokenizer) -> None:
    """Grow the embeddings when the tokenizer has tokens the checkpoint lacks (an added pad token,
    say); ids beyond the table would otherwise fail at the first forward. Never shrinks: checkpoints
    often pad their vocabulary past the tokenizer's size on purpose."""
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    if getattr(model.config, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id


def resolve_dtype(dtype: str, device: "torch.device", *, default_accelerator) -> Any:
    """`model.dtype` as transformers takes it. "auto": fp32 on CPU, `default_accelerator` elsewhere."""
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cpu":
        return torch.float32
    return default_accelerator


def attention_kwargs(model: ModelConfig) -> dict[str, str]:
    return {} if model.attn_implementation == "auto" else {"attn_implementation": model.attn_implementation}


def _summary(error: Exception) -> str:
    """One line of an exception for a user message. huggingface_hub's validation errors put a
    header first and the useful line last ("ValueError: The hidden size (30) is not a multiple...")."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    return lines[-1] if lines[0].endswith(":") else lines[0]
