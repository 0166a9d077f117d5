"""The policy's full weights under their Hugging Face names, as an inference engine loads them: what a
vLLM sampler is sent when the policy moved (ditty.objectives.sampling.vllm_sampler, vllm_server).

- Under DDP or torch.compile: the module inside (`unwrap`).
- Under FSDP2: each parameter's shards gathered whole (`DTensor.full_tensor`, a collective every rank
  runs in the same order: every rank calls this at the same step).
- Under LoRA: the merged weights, W + the adapter's delta, computed out of place: merging into the
  live weights and unmerging would leave them off by rounding.

Parameters only (a model's buffers, rotary frequencies say, do not train). Tensors are detached, on
the CPU when `cpu`; with `copy` they are copies the training step can no longer change.

`stream_policy_weights` gathers them one parameter at a time as its consumer asks (every rank must
consume it whole, in step with the others: each gather is a collective), so no rank holds more than
one gathered parameter beyond its shard; `weight_buckets` groups that stream into buckets of about a
given size (the files a rollout server reads). `policy_weights` holds them all at once: the copy a
step sampled ahead needs, since its sampler loads them later, on another thread.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from ditty._utils.modules import is_peft_model, unwrap


def stream_policy_weights(model: Any, *, cpu: bool = False, copy: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    model = unwrap(model)
    named = merged_adapter_weights(model) if is_peft_model(model) else model.named_parameters()
    for name, tensor in named:
        live = tensor.detach()
        value = whole(live)
        if cpu:
            value = value.cpu()
        if copy and value.data_ptr() == live.data_ptr():  # still the live storage: the next step would change it
            value = value.clone()
        yield name, value


def policy_weights(model: Any, *, cpu: bool = False, copy: bool = False) -> list[tuple[str, torch.Tensor]]:
    return list(stream_policy_weights(model, cpu=cpu, copy=copy))


def weight_buckets(
    weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """`weights` in lists of about `bucket_bytes` each (a parameter larger than that is a bucket alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (FSDP2's shards gathered); any other tensor as it is."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


ADAPTER_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")


def merged_adapter_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's parameters under their own names, each adapted layer's weight merged with its
    active adapters' deltas (PEFT's `get_delta_weight`); the adapter matrices themselves left out."""
    base = model.get_base_model()
    adapted = {}
    for module_name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            adapted[module_name] = module
    for name, parameter in base.named_parameters():
        if any(f".{kind}." in f".{name}." for kind in ADAPTER_PARTS):
            continue
        clean = name.replace(".base_layer.", ".")
        module_name = clean.rsplit(".", 1)[0]
        layer = adapted.get(module_name)
        if layer is not None and clean.endswith(".weight") and name.endswith("base_layer.weight"):
            with torch.no_grad():
                merged = whole(parameter.detach()).clone()
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        merged += whole(layer.get_delta_weight(adapter)).to(merged.dtype)
            yield clean, merged
        else:
            yield clean, parameter
