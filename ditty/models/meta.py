"""Low-memory building for sharded training: a model with meta parameters, whose weights arrive after
it is sharded, so no rank ever holds the whole model.

Two cases (`build_low_memory` decides which applies, on rank 0, and every rank follows):
- a full finetune of a local safetensors checkpoint: every rank builds the architecture on the meta
  device; after sharding, rank 0 reads the checkpoint tensor by tensor and each rank keeps its slice;
- QLoRA (a 4-bit base with LoRA): rank 0 loads and quantizes as one process would; the others build
  the same modules on the meta device from a skeleton rank 0 shares (its config, every `Linear4bit`
  with its packed shape, every tensor's name, shape and dtype) and receive the tensors and
  quantization states after sharding (the loading Answer.AI published for FSDP + QLoRA).
Otherwise every rank builds the whole model and sharding drops the rest: parameter bytes shrink,
the peak during the build does not.

The result says what still has to be loaded (`PendingWeights`); the engine that shards the model
loads it right after sharding.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from ditty._utils.dist import raise_on_every_rank, share_from_rank0
from ditty._utils.meta import meta_init
from ditty.config.sections import SHARDED_KINDS

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class PendingWeights:
    """Weights a meta-built model still needs, loaded by every rank right after sharding."""

    source_dir: Optional[str]
    """Full finetune: the safetensors directory rank 0 reads (None on the other ranks)."""
    quantized: bool
    """QLoRA: rank 0 sends the tensors it loaded and quantized, then the quantization states."""


def build_low_memory(
    config: Any, tokenizer: Any, device: "torch.device", labels: Any = None
) -> "Optional[tuple[nn.Module, PendingWeights]]":
    """(model with meta parameters, what to load after sharding), or None when the low-memory build
    does not apply and the caller builds the whole model as usual.

    It applies to fsdp/hsdp on several processes for a pretrained Hugging Face model in a local
    directory, named by the recipe (not a factory), either a full finetune of safetensors weights or
    QLoRA (`quant.kind = "bnb-4bit"` with `peft.kind = "lora"`, no fp8, no remote code), whose
    checkpoint holds every weight of the task's model (`checkpoint_fits_task`: a new classifier head
    has nothing to stream, so such a model is built whole). Decided on rank 0 and shared (one small
    broadcast), so ranks that see the directory differently cannot take different paths and wait on
    each other.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    if not _applies(config):
        return None
    quantized = config.quant.kind != "none"
    path = config.model.path
    source = None
    if dist.get_rank() == 0 and os.path.isdir(path):
        # rank 0 loads a quantized base with from_pretrained (any format it reads); a full finetune
        # streams safetensors.
        has_weights = quantized or any(
            os.path.exists(os.path.join(path, name)) for name in ("model.safetensors", "model.safetensors.index.json")
        )
        source = path if has_weights and checkpoint_fits_task(path, config.model.task, labels) else None
    source = share_from_rank0(source)
    if source is None:
        return None
    if quantized:
        model = build_quantized_on_meta(config, tokenizer, device, labels)
    else:
        model = build_on_meta(config, tokenizer, device, labels)
        if model is None:
            return None
    return model, PendingWeights(source_dir=source if dist.get_rank() == 0 else None, quantized=quantized)


def _applies(config: Any) -> bool:
    m = config.model
    if config.parallel.kind not in SHARDED_KINDS or m.factory or m.resolved_init != "pretrained" or not m.path:
        return False
    if getattr(getattr(config, "mtp", None), "depth", 0) > 0:  # the heads' new weights are in no checkpoint file
        return False
    if config.quant.kind == "none":
        return config.peft.kind == "none"  # peft would create the adapter on the meta device of its base layer
    fp8 = getattr(config, "fp8", None)
    return (
        config.quant.kind == "bnb-4bit"
        and config.peft.kind == "lora"
        and not getattr(fp8, "enabled", False)
        and not m.trust_remote_code
    )


def checkpoint_fits_task(path: str, task_name: str, labels: Any) -> bool:
    """Whether the checkpoint in `path` was saved by the task's own class (with as many labels): then it
    holds every weight the meta-built model will ask for. A causal LM checkpoint always counts (the
    low-memory build predates tasks and reports a missing weight itself)."""
    import json

    from ditty.models.task_support import auto_mapping
    from ditty.models.tasks import model_task

    task = model_task(task_name)
    if task.name == "causal-lm":
        return True
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, ValueError):
        return False
    wanted = auto_mapping(task.auto_mapping).get(saved.get("model_type"))
    if wanted is None or wanted not in (saved.get("architectures") or ()):
        return False
    if task.num_labels is not None:  # a reward model's one score
        return len(saved.get("id2label") or {}) == task.num_labels
    return not task.labels or len(saved.get("id2label") or {}) == len(labels or ())


def build_on_meta(config: Any, tokenizer: Any, device: "torch.device", labels: Any = None) -> "Optional[nn.Module]":
    """The pretrained architecture with meta parameters (real buffers), or None when the tokenizer
    needs a larger embedding than the checkpoint's (the ordinary build resizes it)."""
    import torch

    from ditty.models.build import attention_kwargs, hf_config, label_config, resolve_dtype
    from ditty.models.tasks import model_task, transformers_class

    m = config.model
    _, architecture = hf_config(m, label_config(labels, m.task))
    if tokenizer is not None and len(tokenizer) > architecture.vocab_size:
        return None
    dtype = resolve_dtype(m.dtype, device, default_accelerator=None)
    if not isinstance(dtype, torch.dtype):  # "auto" on an accelerator: the checkpoint's own dtype
        dtype = getattr(architecture, "dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    with meta_init():
        model = transformers_class(model_task(m.task)).from_config(
            architecture, dtype=dtype, trust_remote_code=m.trust_remote_code, **attention_kwargs(m)
        )
    if getattr(model.config, "pad_token_id", None) is None and getattr(tokenizer, "pad_token_id", None) is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model


def build_quantized_on_meta(config: Any, tokenizer: Any, device: "torch.device", labels: Any = None) -> "nn.Module":
    """QLoRA: rank 0 builds and quantizes the model exactly as one process does; the others build the
    skeleton rank 0 shares with meta parameters, and take rank 0's RNG state so the adapters peft
    creates next draw what rank 0's draw (they are sent from rank 0 anyway). An error on any rank
    (a bad checkpoint on rank 0) is raised on every rank."""
    import torch
    import torch.distributed as dist

    from ditty.models.build import attention_kwargs, build_model
    from ditty.models.quant import quantized_skeleton, rebuild_quantized_on_meta
    from ditty.models.tasks import model_task, transformers_class

    rank = dist.get_rank()
    model = None
    payload: Any = None
    if rank == 0:
        try:
            model = build_model(config.model, tokenizer=tokenizer, device=device, quant=config.quant, labels=labels)
            payload = {
                "skeleton": quantized_skeleton(model),
                "rng": torch.get_rng_state(),
                "new_head": getattr(model, "ditty_new_head", ()),  # the adapter trains it: same on every rank
            }
        except Exception as error:  # every rank raises it: none waits for weights that never come
            payload = error
    payload = share_from_rank0(payload)
    if isinstance(payload, BaseException):
        raise payload
    error: Optional[BaseException] = None
    if rank != 0:
        try:
            skeleton = payload["skeleton"]
            architecture = copy.deepcopy(skeleton["config"])
            for key in ("quantization_config", "_is_quantized"):  # a plain architecture first
                architecture.__dict__.pop(key, None)
            with meta_init():
                model = transformers_class(model_task(config.model.task)).from_config(
                    architecture, dtype=skeleton["dtype"], **attention_kwargs(config.model)
                )
            model = rebuild_quantized_on_meta(model, skeleton)
            model.ditty_new_head = payload["new_head"]
            torch.set_rng_state(payload["rng"])
        except Exception as exc:  # noqa: BLE001 - shared below, so rank 0 does not wait in fully_shard's peers
            error = exc
    raise_on_every_rank(error, "building its meta-device model")
    assert model is not None
    return model
