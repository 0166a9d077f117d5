"""LoRA runs that send the engine only their adapter: vLLM's LoRA serving, as prime-rl and AReaL sync.

An engine started with LoRA enabled (`engine_kwargs`) is sent the base model's weights once (the
frozen weights under their Hugging Face names, not merged), and after that, at every policy version,
only the adapter: its matrices, gathered from FSDP shards one at a time, written as a PEFT adapter
directory (`adapter_model.safetensors` beside its `adapter_config.json`) that the engine reloads in
place under one adapter id (`LoRARequest(load_inplace=True)` on the first request after a write). A
rank r adapter over a d x d layer is 2rd numbers, not d^2: at rank 16 on a 4096-wide model, under 1%
of the layer.

`adapter_plan` says whether a policy can go this way; a policy it cannot is sent merged, as before
(ditty.objectives.sampling.policy_weights): DoRA (vLLM serves LoRA only), an adapter on the
embeddings or the output head, `modules_to_save` (whole trained copies of modules), or a quantized base
(the engine would be sent the 4-bit storage).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

from ditty._utils.modules import is_peft_model

ENGINE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's max_lora_rank takes (vllm.config.lora.MaxLoRARanks): an engine serves every rank
up to its own."""
NOT_SERVED = ("lm_head", "embed_tokens", "embed_out", "wte", "word_embeddings")
"""Modules whose adapters vLLM does not serve as a layer's LoRA."""


@dataclass(frozen=True)
class AdapterPlan:
    rank: int
    """The adapter's rank (the largest of its layers' with rank_pattern)."""
    engine_rank: int
    """The engine's max_lora_rank: the smallest it takes at or above `rank`."""
    config: dict
    """The adapter's PEFT config, as adapter_config.json holds it."""


def adapter_plan(model: Any) -> Optional[AdapterPlan]:
    """How to send `model`'s adapter alone to a vLLM engine, or None when it goes merged (see the module doc)."""
    if not is_peft_model(model):
        return None
    configs = model.peft_config
    if len(configs) != 1:
        return None
    config = next(iter(configs.values()))
    if str(getattr(config, "peft_type", "")).rsplit(".", 1)[-1] != "LORA" or getattr(config, "use_dora", False):
        return None
    if getattr(config, "modules_to_save", None):
        return None
    base = model.get_base_model()
    if getattr(base, "hf_quantizer", None) is not None or getattr(base, "is_quantized", False):
        return None
    adapted = [name for name, module in base.named_modules() if hasattr(module, "lora_A") and module.lora_A]
    if not adapted or any(name.rsplit(".", 1)[-1] in NOT_SERVED for name in adapted):
        return None
    rank = max([config.r, *(getattr(config, "rank_pattern", None) or {}).values()])
    engine_rank = next((r for r in ENGINE_RANKS if r >= rank), None)
    if engine_rank is None:
        return None
    return AdapterPlan(rank, engine_rank, config.to_dict())


def engine_kwargs(plan: AdapterPlan) -> dict[str, Any]:
    """What vllm.LLM needs to serve the adapter: one adapter at a time, of up to the plan's rank."""
    return {"enable_lora": True, "max_lora_rank": plan.engine_rank, "max_loras": 1}


def adapter_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter's matrices under the names PEFT saves them (`...q_proj.lora_A.weight`), each gathered
    whole from its FSDP shards (every rank must consume the stream whole, in step: each is a collective)."""
    from peft import get_peft_model_state_dict

    from ditty.objectives.sampling.policy_weights import whole

    for name, tensor in get_peft_model_state_dict(model).items():
        yield name, whole(tensor.detach())


def base_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's own parameters under their Hugging Face names (`.base_layer.` dropped), not
    merged with the adapter, each gathered whole; the adapter matrices left out."""
    from ditty.objectives.sampling.policy_weights import ADAPTER_PARTS, whole

    for name, parameter in model.get_base_model().named_parameters():
        if any(f".{kind}." in f".{name}." for kind in ADAPTER_PARTS):
            continue
        yield name.replace(".base_layer.", "."), whole(parameter.detach())


class AdapterFiles:
    """The directory an engine reads the adapter from, and the request that names it. `write` replaces
    the adapter; the next `request()` asks the engine to reload it in place (also the first time: an engine
    taken over from an earlier run of the process may hold another adapter under the same id), later
    ones to use it."""

    NAME = "ditty-policy"
    ID = 1

    def __init__(self, plan: AdapterPlan) -> None:
        self.directory = tempfile.mkdtemp(prefix="ditty-adapter-")
        with open(os.path.join(self.directory, "adapter_config.json"), "w", encoding="utf-8") as handle:
            json.dump(plan.config, handle, default=_json_value, indent=1)
        self.reload = False

    def write(self, weights: Any) -> list[str]:
        """Write `weights` ((name, tensor) pairs) as the adapter; the names written."""
        from safetensors.torch import save_file

        tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in weights}
        partial = os.path.join(self.directory, "adapter_model.safetensors.partial")
        save_file(tensors, partial)
        os.replace(partial, os.path.join(self.directory, "adapter_model.safetensors"))
        self.reload = True
        return list(tensors)

    def request(self) -> Any:
        from vllm.lora.request import LoRARequest

        reload, self.reload = self.reload, False
        return LoRARequest(self.NAME, self.ID, self.directory, load_inplace=reload)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _json_value(value: Any) -> Any:
    """PEFT configs hold sets and enums; adapter_config.json holds lists and strings (as PEFT writes them)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return getattr(value, "value", str(value))
