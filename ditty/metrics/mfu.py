"""Model FLOPs utilisation: how far a run's throughput is from the hardware's peak.

    mfu = model FLOPs per token x tokens/s / (peak FLOP/s per device x devices)

Model FLOPs per token, for a Hugging Face transformer (from its config and parameters, as PaLM's
appendix B and torchtitan count them):
- 2 FLOPs per multiply-add of every parameter used in a matrix product: the forward's 2N, the
  backward's 2N for the activations' gradients and 2 N_trainable for the weights' gradients (6N
  for a full finetune; a frozen LoRA base costs 4 of its 6). N leaves out the input embeddings (a
  lookup), keeps the output head, and counts a mixture-of-experts layer's experts at top-k / experts.
- attention scores and values: 12 x layers x heads x head_dim x sequence length (4 forward, 8
  backward), with `data.max_seq_len` as the sequence length.
`hfu` adds what activation checkpointing recomputes ("full": the forward again; "selective" keeps
the matrix products and recomputes element-wise ops only, which count no FLOPs here). Models without
a transformer config (custom nn.Modules) are counted instead by torch's FlopCounterMode over one
training forward, times 3 for the backward (`measure_forward_flops`), per sample.

Peak FLOP/s: ditty.metrics.peak (table of accelerators by dtype, a measured CPU peak, or
`[logging] peak_tflops`).
"""

from __future__ import annotations

import logging
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from ditty._utils.modules import unwrap
from ditty.metrics.peak import device_peak_flops

log = logging.getLogger("ditty.metrics")

_METERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_MEASURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""model -> training FLOPs per sample, measured by measure_forward_flops (custom models)."""


@dataclass(frozen=True)
class FlopsPerToken:
    model: float
    """FLOPs the model's math needs per token (forward and backward)."""
    recompute: float = 0.0
    """FLOPs activation checkpointing adds per token (forward recomputed in the backward)."""


def utilization(model: Any, config: Any, device: Any, world_size: int, tokens_per_s: Optional[float]) -> dict:
    """{"mfu": ..., "hfu": ...} for a metrics record (None where unknown: an accelerator missing from
    the table without `[logging] peak_tflops`, or a custom model not measured yet). `tokens_per_s`
    is the global rate (all ranks; samples/s for non-text data); `config` the run's Trainer.Config."""
    meter = _METERS.get(model)
    if meter is None:
        meter = _Meter(model, config, device)
        _METERS[model] = meter
    return meter.record(tokens_per_s, world_size)


class _Meter:
    def __init__(self, model: Any, config: Any, device: Any) -> None:
        self.model = weakref.ref(model)
        self.peak = device_peak_flops(
            device,
            config.train.precision,
            fp8=config.fp8.enabled,
            override_tflops=getattr(config.logging, "peak_tflops", None),
        )
        if self.peak is None:
            log.warning("mfu: peak FLOP/s of this device is unknown; set [logging] peak_tflops to report it")
        self.per_token = transformer_flops_per_token(
            model, config.data.max_seq_len, config.train.activation_checkpointing
        )

    def record(self, tokens_per_s: Optional[float], world_size: int) -> dict:
        per_token = self.per_token
        if per_token is None:  # a custom model: measured on its first training forward
            model = self.model()
            measured = _MEASURED.get(unwrap(model, peft=True)) if model is not None else None
            per_token = FlopsPerToken(measured) if measured else None
        if per_token is None or not self.peak or tokens_per_s is None:
            return {"mfu": None, "hfu": None}
        capacity = self.peak * max(world_size, 1)
        return {
            "mfu": _significant(per_token.model * tokens_per_s / capacity),
            "hfu": _significant((per_token.model + per_token.recompute) * tokens_per_s / capacity),
        }


def _significant(value: float) -> float:
    return float(f"{value:.4g}")


def transformer_flops_per_token(model: Any, seq_len: int, activation_checkpointing: str = "none"):
    """FlopsPerToken of a Hugging Face transformer (see the module docstring), or None when the
    model has no transformer config (layers, heads, hidden size)."""
    base = unwrap(model, peft=True)
    text = _transformer_config(base)
    if text is None:
        return None
    layers, heads, hidden = text.num_hidden_layers, text.num_attention_heads, text.hidden_size
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    matmul, trainable = matmul_parameters(base, text)
    attention = 12 * layers * heads * head_dim * seq_len
    model_flops = 4 * matmul + 2 * trainable + attention
    recompute = 2 * matmul + attention / 3 if activation_checkpointing == "full" else 0.0
    return FlopsPerToken(float(model_flops), float(recompute))


def _transformer_config(model: Any) -> Any:
    """The (text) config of a Hugging Face transformer, None for other models."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    ok = all(getattr(text, name, None) for name in ("num_hidden_layers", "num_attention_heads", "hidden_size"))
    return text if ok else None


def matmul_parameters(model: Any, config: Any) -> tuple[int, int]:
    """(parameters used in matrix products per token, those of them that are trainable): input
    embeddings left out unless tied to the output head, experts scaled by top-k / experts."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_params = {id(p) for p in head.parameters()} if isinstance(head, torch.nn.Module) else set()
    lookups = {
        id(p)
        for module in model.modules()
        if isinstance(module, torch.nn.Embedding)
        for p in module.parameters()
        if id(p) not in head_params
    }
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    share = top_k / experts if experts and top_k else 1.0
    total = trainable = 0
    seen: set[int] = set()
    for name, param in model.named_parameters():
        if id(param) in seen or id(param) in lookups:
            continue
        seen.add(id(param))
        count = _numel(param) * (share if ".experts." in name or name.endswith(".experts") else 1.0)
        total += count
        trainable += count if param.requires_grad else 0
    return int(total), int(trainable)


def _numel(param: Any) -> int:
    """Elements of a parameter as the model uses it: DeepSpeed ZeRO-3 keeps `ds_numel`, bitsandbytes
    4-bit weights their original shape in `quant_state`, DTensor reports its global size."""
    if hasattr(param, "ds_numel"):
        return int(param.ds_numel)
    shape = getattr(getattr(param, "quant_state", None), "shape", None)
    if shape is not None:
        count = 1
        for size in shape:
            count *= int(size)
        return count
    return int(param.numel())


@contextmanager
def measure_forward_flops(model: Any, samples: int) -> Iterator[None]:
    """Around a custom model's first training forward: count its FLOPs with torch's FlopCounterMode
    and keep 3x per sample (forward and a backward of twice its cost). Once per model; a no-op for
    models with a transformer config and afterwards. Cost: one forward through a Python dispatch mode.

    That forward runs eagerly (dynamo's "force_eager" stance): dynamo skips a frame it meets under a
    Python dispatch mode and never compiles that code again, so a compiled model counted here would
    have trained eagerly for the whole run. Compilation waits for the second forward instead."""
    if model in _MEASURED or _transformer_config(unwrap(model, peft=True)) is not None or samples <= 0:
        yield
        return
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.compiler.set_stance("force_eager"), counter:
        yield
    _MEASURED[model] = 3.0 * counter.get_total_flops() / samples
