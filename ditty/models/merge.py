"""Saving what an adapter run trained: the PEFT adapter, or a full model with the adapter merged in.

- `save_adapter`: the adapter only (adapter_model.safetensors + adapter_config.json) and the
  tokenizer; `PeftModel.from_pretrained(base, dir)` and the task's `AutoPeftModelFor...` (for a
  causal LM `AutoPeftModelForCausalLM`) load it. The adapter config names the base
  (`base_model_name_or_path`) as the run loaded it.
- `merge_to_full`: a plain transformers model (no peft, no bitsandbytes) computing what the trained
  model computes. It never modifies the trained model, so training or evaluation can go on.
  * full-precision base: peft's `merge_and_unload(safe_merge=True)` on a fresh peft model that
    shares the base's unmerged tensors (only the merged weights are new memory);
  * 4-bit base (QLoRA): each `Linear4bit` weight is dequantized (bitsandbytes'
    `dequantize_4bit`, exactly what its forward multiplies with) into a plain `Linear`, then the
    adapter is merged. The result matches the QLoRA model's logits, NOT those of the original
    full-precision checkpoint plus the adapter: the adapter learned to correct the 4-bit weights;
  * 8-bit base: refused (RecipeError). LLM.int8 keeps outlier columns in fp16 and the rest as int8
    with per-row scales; rounding the merged weights back to int8 would lose the small adapter
    update, and ditty does not write a dequantized-int8 full model. The compiler refuses
    `checkpoint.final_format = "merged"` with bnb-8bit before the run (compat.merge-8bit).
- `save_merged`: `merge_to_full` then `save_pretrained` (safetensors) plus the tokenizer; the task's
  Auto class (`AutoModelForCausalLM`, `AutoModelForSequenceClassification`, ...) loads it.
- Under FSDP the model's parameters are this rank's shards: pass the full state dict gathered from
  every rank (`state_dict`, rank 0 only) and the base and adapter tensors come from it instead.
  A 4-bit weight arrives there as its gathered packed bytes; its quantization state (block scales,
  code book) is not sharded (bitsandbytes keeps a full copy on each `Linear4bit` as `quant_state`),
  so rank 0 dequantizes it exactly as on one process.
"""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any, Optional

from ditty.config.errors import RecipeError

if TYPE_CHECKING:
    import torch

# Submodules peft adds; their tensors are the adapter's, not the base's.
_ADAPTER_SEGMENTS = frozenset(
    {
        "lora_A",
        "lora_B",
        "lora_embedding_A",
        "lora_embedding_B",
        "lora_magnitude_vector",
        "lora_dropout",
        "modules_to_save",
    }
)
# Wrapper segments peft inserts between a module's name and the original layer.
# Module names that wrappers insert: peft's base_layer/original_module, and torch's activation
# checkpoint wrapper (`checkpoint_wrapper`'s _CHECKPOINT_WRAPPED_MODULE) around each block.
_WRAPPER_SEGMENTS = frozenset({"base_layer", "original_module", "_checkpoint_wrapped_module"})


def save_adapter(model: "torch.nn.Module", directory: str, tokenizer: Any = None) -> str:
    """Write the PEFT adapter of `model` (a peft model) and the tokenizer to `directory`."""
    _require_peft_model(model)
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(directory)
    return directory


def merge_to_full(
    model: "torch.nn.Module", state_dict: "Optional[dict[str, torch.Tensor]]" = None
) -> "torch.nn.Module":
    """A plain model with the adapter of `model` merged in (see the module docstring); `model` is unchanged.

    `state_dict`: the full state dict of `model` (its own parameter names) gathered from a sharded
    (FSDP) model; the tensors are read from it rather than from `model`'s local shards. No collective.
    """
    import torch
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import PreTrainedModel

    _require_peft_model(model)
    base = model.get_base_model()
    if getattr(base, "is_loaded_in_8bit", False):
        raise RecipeError.single(
            "an adapter cannot be merged into LLM.int8 (8-bit) weights without losing it to rounding",
            key="checkpoint.final_format",
            fix='keep the adapter (checkpoint.final_format = "auto"), or train with quant.kind = "bnb-4bit"',
        )
    adapter_name = model.active_adapter
    peft_config = copy.deepcopy(model.peft_config[adapter_name])
    if not isinstance(base, PreTrainedModel):
        if state_dict is not None:
            raise TypeError(
                "merging a sharded custom nn.Module (no Hugging Face config to rebuild it from) is not "
                "supported: export it from a checkpoint with `ditty export --merge-lora`"
            )
        # A custom nn.Module has no config to rebuild it from: merge a copy.
        return copy.deepcopy(model).merge_and_unload(safe_merge=True)

    gathered, base_prefix = None, ""
    if state_dict is not None:
        # Model names and state-dict names differ only by the wrapper the state dict drops.
        gathered = {_without_checkpoint_wrapper(name): tensor for name, tensor in state_dict.items()}
        base_prefix = next(name for name, module in model.named_modules() if module is base)
    base_state, extra_buffers = _plain_base_tensors(base, gathered, base_prefix)
    plain = _empty_plain_model(base)
    plain.load_state_dict(base_state, strict=True, assign=True)
    for name, buffer in extra_buffers.items():
        owner, _, leaf = name.rpartition(".")
        plain.get_submodule(owner).register_buffer(leaf, buffer, persistent=False)
    plain.tie_weights()
    left_on_meta = [name for name, t in [*plain.named_parameters(), *plain.named_buffers()] if t.is_meta]
    if left_on_meta:
        raise RuntimeError(f"merge: tensors not restored from the trained model: {left_on_meta[:5]}")

    with torch.no_grad():
        fresh = get_peft_model(plain, peft_config, adapter_name=adapter_name)
        adapter_state = get_peft_model_state_dict(model, state_dict=state_dict, adapter_name=adapter_name)
        set_peft_model_state_dict(fresh, adapter_state, adapter_name=adapter_name)
        merged = fresh.merge_and_unload(safe_merge=True)
    merged.requires_grad_(False)
    return merged.eval()


def save_merged(
    model: "torch.nn.Module",
    directory: str,
    tokenizer: Any = None,
    *,
    state_dict: "Optional[dict[str, torch.Tensor]]" = None,
) -> str:
    """Write the merged full model in Hugging Face format (safetensors, config) plus the tokenizer.

    `model` is a peft model (merged here with `merge_to_full`, from `state_dict` when it is sharded)
    or an already merged plain model.
    """
    from peft import PeftModel

    from ditty.models.mtp.weights import saving_heads

    os.makedirs(directory, exist_ok=True)
    with saving_heads(model, directory, state_dict, full=True) as state_dict:  # [mtp] heads: beside the model
        merged = merge_to_full(model, state_dict) if isinstance(model, PeftModel) else model
        merged.save_pretrained(directory)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(directory)
    return directory


def _require_peft_model(model: "torch.nn.Module") -> None:
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        raise TypeError(f"expected a peft model (from LoraConverter), got {type(model).__name__}")


def _plain_base_tensors(
    base: "torch.nn.Module", gathered: "Optional[dict[str, torch.Tensor]]" = None, base_prefix: str = ""
) -> "tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]":
    """The base model's own tensors under the names a plain (un-adapted, unquantized) model of the
    same class uses: (persistent parameters and buffers, non-persistent buffers).

    4-bit weights are dequantized here; every other tensor is the trained model's own (no copy).
    `gathered`: the full state dict gathered from a sharded (FSDP) model, under the names of the
    model that holds `base` as `base_prefix`: parameters and persistent buffers come from it.
    Non-persistent buffers (rotary frequencies) are never sharded and come from the model.
    """
    import types

    import bitsandbytes as bnb

    from ditty.models.quant import dequantize_4bit_weight

    def own(module_name: str, name: str, tensor: "torch.Tensor") -> "torch.Tensor":
        if gathered is None:
            return tensor.detach()
        return gathered[_without_checkpoint_wrapper(".".join(filter(None, (base_prefix, module_name, name))))]

    state: dict[str, "torch.Tensor"] = {}
    extra_buffers: dict[str, "torch.Tensor"] = {}
    for module_name, module in base.named_modules():
        segments = module_name.split(".") if module_name else []
        if any(segment in _ADAPTER_SEGMENTS for segment in segments):
            continue
        prefix = ".".join(segment for segment in segments if segment not in _WRAPPER_SEGMENTS)
        prefix = prefix + "." if prefix else ""
        for name, parameter in module.named_parameters(recurse=False):
            if isinstance(module, bnb.nn.Linear4bit) and name == "weight":
                if gathered is not None:
                    # The gathered packed bytes, with the state FSDP's parameter lost but the module kept.
                    quant_state = getattr(parameter, "quant_state", None)
                    quant_state = module.quant_state if quant_state is None else quant_state
                    parameter = types.SimpleNamespace(data=own(module_name, name, parameter), quant_state=quant_state)
                dense = dequantize_4bit_weight(parameter)
                # The 4-bit forward multiplies this weight cast to its compute dtype; round it the
                # same way, but keep the model's dtype so a plain Linear fits between its neighbours.
                tensor = dense.to(module.compute_dtype or dense.dtype).to(dense.dtype)
            else:
                tensor = own(module_name, name, parameter)
            state[prefix + name] = tensor
        for name, buffer in module.named_buffers(recurse=False):
            if name in module._non_persistent_buffers_set:
                extra_buffers[prefix + name] = buffer
            else:
                state[prefix + name] = own(module_name, name, buffer)
    return state, extra_buffers


def _without_checkpoint_wrapper(name: str) -> str:
    """A tensor's name without activation checkpointing's wrapper segment (state dicts drop it)."""
    return ".".join(segment for segment in name.split(".") if segment != "_checkpoint_wrapped_module")


def _empty_plain_model(base: "torch.nn.Module") -> "torch.nn.Module":
    """The same architecture as `base` (its own class, so the task's: a sequence classifier stays one),
    unquantized, with its tensors on the meta device (no memory, no random init):
    `load_state_dict(assign=True)` then puts real tensors in."""
    import torch

    config = copy.deepcopy(base.config)
    for attribute in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attribute):
            delattr(config, attribute)
    with torch.device("meta"):
        return type(base)._from_config(config, dtype=base.dtype)
