"""The model a whole recipe describes, before parallelization: the `[model]` build (or the Python API's
instance, quantized as `[quant]` asks), the packed-attention choices of `data.packing`, and the
converters that `[peft]`, `[fp8]` and `model.converters` name. The trainer, `ditty export` and the
reference models of preference and RL training build it the same way.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from ditty._utils.dist import is_main_process


def with_packed_kernel(config: Any, device: torch.device) -> Any:
    """The config with `model.attn_implementation` = "auto" resolved for packed rows (see
    ditty.models.packing.packed_kernel: flex_attention on CUDA); otherwise the config as it is."""
    from dataclasses import replace

    from ditty.models import read_model_type
    from ditty.models.packing import packed_kernel

    if not config.data.packing or config.model.factory:
        return config
    kernel = packed_kernel(read_model_type(config.model), config.model.attn_implementation, device.type)
    if kernel is None:
        return config
    if is_main_process():
        print(f'packed rows on {device.type}: attention through {kernel} (model.attn_implementation = "auto")')
    return replace(config, model=replace(config.model, attn_implementation=kernel))


def base_model_for(
    config: Any,
    tokenizer: Any,
    device: torch.device,
    *,
    given: Optional[torch.nn.Module] = None,
    low_memory: bool = True,
    labels: Any = None,
) -> tuple[torch.nn.Module, Any]:
    """(model before converters, weights still pending after sharding or None): the Python API's
    instance (quantized as `[quant]` asks), a low-memory meta build (`low_memory`, sharded runs), or
    the ordinary build. `labels`: a LabelSpace (ditty.data.labels) for the classifying tasks."""
    from ditty.models import build_model

    names = list(labels.names) if labels is not None else None
    config = with_packed_kernel(config, device)
    if given is not None:
        from ditty.models.quant import quantize_instance

        return with_packed_attention(quantize_instance(given, config.quant, device), config), None
    if low_memory:
        from ditty.models.meta import build_low_memory

        built = build_low_memory(config, tokenizer, device, names)
        if built is not None:
            return with_packed_attention(built[0], config), built[1]
    model = build_model(config.model, tokenizer=tokenizer, device=device, quant=config.quant, labels=names)
    return with_packed_attention(model, config), None


def with_packed_attention(model: torch.nn.Module, config: Any) -> torch.nn.Module:
    """The model, told `model.packed_attention` (read by ditty.models.packing.packed_inputs) when the
    recipe packs rows and names a path other than "auto"."""
    if config.data.packing and config.model.packed_attention != "auto":
        from ditty.models.packing import CHOICE_ATTRIBUTE

        setattr(model, CHOICE_ATTRIBUTE, config.model.packed_attention)
    return model


def converters_for(config: Any) -> list:
    """Model rewrites applied in order: `model.converters`, or by default the adapter (LoRA/DoRA) then
    FP8 linears. A "package.module:Class" entry is built without arguments (the compiler checked it:
    rule model.converters). Converters run after loading and before parallelization, compile and the
    optimizer, so the optimizer sees only the parameters they leave trainable."""
    from ditty.config.references import import_reference
    from ditty.config.sections import SHARDED_KINDS

    sharded = config.parallel.kind in SHARDED_KINDS
    builtin = {}
    if config.peft.kind != "none":
        from ditty.models.adapters import LoraConverter

        # Under FSDP every block must keep one dtype, so quantized bases are not upcast there.
        builtin["peft"] = lambda: LoraConverter(config.peft, upcast_quantized=not sharded, task=config.model.task)
    if config.fp8.enabled:
        from ditty.models.float8 import Float8Converter

        builtin["fp8"] = lambda: Float8Converter(config.fp8, fsdp=sharded)
    order = list(config.model.converters or builtin)
    converters = [
        builtin[name]() if name in builtin else import_reference(name, key="model.converters")() for name in order
    ]
    if config.mtp.depth > 0:  # last: new weights, trained in full beside an adapter (ditty.models.mtp)
        from ditty.models.mtp.converter import MTPConverter

        converters.append(MTPConverter(config.mtp.depth, source_dir=_local_source(config.model)))
    return converters


def _local_source(model: Any) -> Optional[str]:
    """The local directory a pretrained model loads from (where saved MTP heads may wait), else None."""
    if model.factory or model.resolved_init != "pretrained" or not model.path:
        return None
    from ditty.models.source import cached_hub_file, local_model_dir

    local = local_model_dir(model.path)
    if local is None:  # a hub id: its snapshot in the local cache, if it was downloaded
        cached = cached_hub_file(model.path)
        local = os.path.dirname(cached) if cached else None
    return local
