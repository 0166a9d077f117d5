"""FP8 training of the linear layers, as a `ModelConverter` (see ditty.models.converters).

Two backends, chosen by `[fp8] backend`:
- "torchao" (default): `torchao.float8.convert_to_float8_training` swaps each eligible `nn.Linear`
  for a `Float8Linear` that casts input, weight and grad to float8 with dynamic per-tensor scales.
  It keeps the weight values and their storage (fp32/bf16 master weights), so the swap works on the
  meta device before the weights are materialized, and FSDP2 then shards the converted model.
  `emulate = true` runs the float8 casts with ordinary matmuls, so the code path runs on a CPU
  (for tests: it is slower, not faster). Under FSDP2 the float8 all-gather is turned on, and the
  post-optimizer hook computes the scales of all sharded weights in one all-reduce per step
  (`precompute_float8_dynamic_scale_for_fsdp`) instead of one per layer in the forward.
- "te": NVIDIA Transformer Engine. Its linears need `transformer_engine` and a CUDA GPU of compute
  capability 8.9+; the recipe compiler already refuses the recipe when it is missing
  (compat.fp8-te-missing), and `convert` raises the same RecipeError if reached anyway.

Layers whose in/out features are not multiples of 16 are skipped (float8 matmuls need it; torchao
would raise), and so is `lm_head` (its vocabulary dimension is rarely aligned and its numerics
matter most: torchtitan also keeps the output projection in high precision).

With LoRA (the LoraConverter runs first), the choice is deliberate: peft's frozen `base_layer`
linears ARE converted (they carry almost all of the FLOPs: float8 speeds their forward and the
input-gradient matmul of their backward on an FP8 GPU, and their weights get no gradient or
optimizer state, so nothing else changes), while the adapter's own `lora_A`/`lora_B` (and
`lora_embedding_*`) linears are NOT: rank-r matmuls are too small to gain from float8 (and r is
often not a multiple of 16), and the trainable low-rank update is exactly what should stay in
high precision. `fp8_eligible` encodes both rules (see ADAPTER_PREFIX).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Mapping, Optional

import torch
from torch import nn

from ditty.config.errors import RecipeError
from ditty.config.sections import Fp8Config

SKIP_NAMES = ("lm_head",)
ADAPTER_PREFIX = "lora_"  # peft's adapter submodules: lora_A, lora_B, lora_embedding_A/B (kept in high precision)


def fp8_eligible(module: nn.Module, fqn: str) -> bool:
    """True for a plain `nn.Linear` both of whose dims are multiples of 16, not named in SKIP_NAMES
    and not part of a LoRA adapter (a path component starting with ADAPTER_PREFIX); peft's frozen
    `base_layer` linears are eligible.

    Subclasses are left alone: bitsandbytes' Linear4bit/Linear8bitLt are `nn.Linear`s whose weights
    are already quantized, and float8 casts of them would be wrong."""
    if type(module) is not nn.Linear:
        return False
    parts = fqn.split(".")
    if parts[-1] in SKIP_NAMES or any(part.startswith(ADAPTER_PREFIX) for part in parts):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


class Float8Converter:
    """Swap eligible linears for float8 training linears (torchao) or Transformer Engine linears."""

    name = "float8"

    def __init__(self, config: Fp8Config, *, fsdp: bool = False):
        self.config = config
        self.fsdp = fsdp  # FSDP2 will shard the model: float8 all-gather and the scale hook

    def convert(self, model: nn.Module) -> nn.Module:
        if self.config.backend == "te":
            return _convert_te(model)
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        cfg = Float8LinearConfig(emulate=self.config.emulate, enable_fsdp_float8_all_gather=self.fsdp)
        convert_to_float8_training(model, config=cfg, module_filter_fn=fp8_eligible)
        if not any(_is_float8(m) for m in model.modules()):
            raise RecipeError.single(
                "fp8: no linear layer could be converted (float8 needs in/out features that are multiples of 16)",
                key="fp8.enabled",
                fix="size hidden_size and intermediate_size as multiples of 16, or set fp8.enabled = false",
            )
        return model

    def post_optimizer_hook(self, model: nn.Module) -> None:
        """Under FSDP2 (DTensor weights): all weights' float8 scales in one all-reduce. Otherwise nothing:
        Float8Linear computes its weight scale in the forward."""
        if not self.fsdp or self.config.backend != "torchao" or not _has_dtensor_params(model):
            return
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)


def float8_modules(model: nn.Module) -> list[nn.Module]:
    """The float8 linears of a model (for tests and the plan)."""
    return [m for m in model.modules() if _is_float8(m)]


def fp8_config_from_accelerator_kwargs(
    kwargs: Optional[Mapping[str, Any]], base: Optional[Fp8Config] = None
) -> Optional[Fp8Config]:
    """The Python API's accelerate-style `accelerator_kwargs` -> an `Fp8Config`, or None when they
    do not ask for FP8 (`mixed_precision` other than "fp8").

    `mixed_precision = "fp8"` enables FP8 on the configured backend (`base`, the recipe's [fp8];
    torchao by default). accelerate's own backend names are honoured when given, as
    `fp8_backend=` or an `FP8RecipeKwargs`-like object with `.backend` in `kwargs_handlers`:
    "AO"/"torchao" -> torchao, "TE" -> te; "MSAMP" is refused (ditty does not ship it). Without
    a CUDA GPU of compute capability 8.9+ the torchao path is emulated, as on a CPU it must be.
    """
    kwargs = dict(kwargs or {})
    if str(kwargs.get("mixed_precision", "")).lower() != "fp8":
        return None
    base = base or Fp8Config()
    backend = kwargs.get("fp8_backend")
    for handler in kwargs.get("kwargs_handlers", None) or ():
        backend = getattr(handler, "backend", None) or backend
    names = {"ao": "torchao", "torchao": "torchao", "te": "te", "transformer_engine": "te"}
    if backend is None:
        chosen = base.backend
    elif str(backend).lower() in names:
        chosen = names[str(backend).lower()]
    else:
        raise RecipeError.single(
            f"accelerator_kwargs asks for FP8 backend {backend!r}, which ditty does not support",
            key="fp8.backend",
            fix='use "AO" (torchao, the default) or "TE" (Transformer Engine)',
        )
    emulate = base.emulate or (chosen == "torchao" and not _fp8_hardware())
    return Fp8Config(enabled=True, backend=chosen, emulate=emulate)


# ---------------------------------------------------------------------------------------- helpers


def _is_float8(module: nn.Module) -> bool:
    return type(module).__name__ == "Float8Linear" or type(module).__module__.startswith("transformer_engine")


def _has_dtensor_params(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _fp8_hardware() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def _convert_te(model: nn.Module) -> nn.Module:
    """Swap eligible linears for `transformer_engine.pytorch.Linear` (weights copied) and run the
    forward under `te.fp8_autocast`. Not exercised by the CPU test suite: it needs CUDA and TE."""
    if importlib.util.find_spec("transformer_engine") is None:
        raise RecipeError.single(
            'fp8.backend = "te" needs Transformer Engine, and the `transformer_engine` package is not '
            "installed (it needs CUDA)",
            key="fp8.backend",
            fix="pip install 'ditty[te]' on a CUDA machine, or use fp8.backend = \"torchao\"",
        )
    import transformer_engine.pytorch as te

    for fqn, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{fqn}.{child_name}" if fqn else child_name
            if not fp8_eligible(child, full):
                continue
            new = te.Linear(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                params_dtype=child.weight.dtype,
                device=child.weight.device,
            )
            with torch.no_grad():
                new.weight.copy_(child.weight)
                if child.bias is not None:
                    new.bias.copy_(child.bias)
            setattr(module, child_name, new)
    inner = model.forward

    def forward(*args, **kwargs):
        with te.fp8_autocast(enabled=True):
            return inner(*args, **kwargs)

    model.forward = forward
    return model
