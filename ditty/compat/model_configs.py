"""The original Ditty's model-side config objects, each mapped onto a recipe section.

`FSDPConfig` -> [parallel], `QuantConfig` -> [quant], `PeftConfig` -> [peft] (see
`ditty.compat.model_factory`, which takes them, also as dicts); `TokenizerFactory` builds a Hugging Face
tokenizer for the run; `ModelTransform` is the original's name for a model converter
(ditty.models.converters). Defaults are ditty's (docs/python-api/coming-from-ditty.md).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Sequence, Union

import torch

from ditty.config.errors import RecipeError

__all__ = ["FSDPConfig", "ModelTransform", "PeftConfig", "QuantConfig", "TokenizerFactory", "dtype_name", "from_dict"]

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def dtype_name(value: Any, key: str) -> Optional[str]:
    """torch.bfloat16 or "bfloat16" (or "bf16") -> "bfloat16"; None stays None."""
    if value is None:
        return None
    if isinstance(value, torch.dtype) and value in _DTYPE_NAMES:
        return _DTYPE_NAMES[value]
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}
    name = aliases.get(value, value) if isinstance(value, str) else None
    if name in _DTYPE_NAMES.values():
        return name
    raise RecipeError.single(
        f"{key} = {value!r} is not a dtype ditty trains in",
        key=key,
        fix="use torch.float32, torch.bfloat16 or torch.float16",
    )


def from_dict(cls: type, value: Any, key: str) -> Any:
    """`value` as an instance of the config class `cls`: None (defaults), an instance, or a dict."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        names = [f.name for f in fields(cls)]
        unknown = [k for k in value if k not in names]
        if unknown:
            close = difflib.get_close_matches(unknown[0], names, n=1)
            raise RecipeError.single(
                f"{cls.__name__} has no field {unknown[0]!r}",
                key=f"{key}.{unknown[0]}",
                fix=f"did you mean {close[0]!r}?" if close else f"its fields: {', '.join(names)}",
            )
        return cls(**value)
    raise RecipeError.single(f"{key} is a {type(value).__name__}, not a {cls.__name__} or a dict", key=key)


@dataclass
class FSDPConfig:
    """FSDP2 sharding of the Python API's model -> [parallel] kind "fsdp"."""

    enabled: bool = False
    transformer_layers: Sequence[type] = field(default_factory=list)
    """Block classes sharded one by one (and checkpointed by activation checkpointing); empty:
    the model's `_no_split_modules`."""
    param_dtype: Any = None
    """Dtype of the gathered parameters (mixed precision), e.g. torch.bfloat16; None: train.precision's."""
    reduce_dtype: Any = None
    """Dtype gradients are reduced in; None: float32 whenever param_dtype is lower."""
    reshard_after_forward: Union[bool, int] = True
    cpu_offload: bool = False
    cpu_offload_pin_memory: bool = True
    original_param_dtype: Any = None
    """Not supported: give the model in the dtype it should keep (model.to(dtype))."""

    def parallel_fields(self) -> dict[str, Any]:
        """The [parallel] fields this stands for (block classes also when disabled: activation
        checkpointing uses them)."""
        if self.original_param_dtype is not None:
            raise RecipeError.single(
                "FSDPConfig(original_param_dtype=...) is not supported",
                key="fsdp_config.original_param_dtype",
                fix="convert the model before handing it over (model.to(torch.bfloat16)); FSDP keeps that dtype",
            )
        if not isinstance(self.enabled, bool):
            raise RecipeError.single(
                f"FSDPConfig(enabled={self.enabled!r}) is not a boolean", key="fsdp_config.enabled", fix="True or False"
            )
        layers = self.transformer_layers
        if not isinstance(layers, (list, tuple)) or not all(isinstance(c, type) for c in layers):
            raise RecipeError.single(
                f"FSDPConfig(transformer_layers={layers!r}) is not a list of classes",
                key="fsdp_config.transformer_layers",
                fix="the block classes themselves, e.g. transformer_layers=[LlamaDecoderLayer]",
            )
        out: dict[str, Any] = {"block_classes": [c.__name__ for c in layers]}
        if self.enabled:
            out.update(
                kind="fsdp",
                param_dtype=dtype_name(self.param_dtype, "fsdp_config.param_dtype"),
                reduce_dtype=dtype_name(self.reduce_dtype, "fsdp_config.reduce_dtype"),
                reshard_after_forward=self.reshard_after_forward,
                cpu_offload=self.cpu_offload,
                pin_memory=self.cpu_offload_pin_memory,
            )
        return out


@dataclass
class QuantConfig:
    """bitsandbytes loading of a Hugging Face model -> [quant] (QLoRA with a PeftConfig)."""

    enabled: bool = False
    bits: int = 4
    use_double_quant: bool = True
    quant_type: str = "nf4"
    compute_dtype: Any = None
    """Dtype the 4-bit layers compute in; None: ditty's default (float32)."""
    quant_storage: Any = None
    """Dtype the packed 4-bit weights are stored as; None: ditty's default (uint8; under FSDP the
    parameter dtype is required, and the compiler says so)."""
    use_dora: bool = False
    """DoRA instead of LoRA for the adapter ([peft] kind "dora")."""

    def quant_fields(self) -> dict[str, Any]:
        if not self.enabled:
            return {}
        if self.bits not in (4, 8):
            raise RecipeError.single(f"QuantConfig(bits={self.bits!r}): use 4 or 8", key="quant_config.bits")
        if self.quant_type not in ("nf4", "fp4"):
            raise RecipeError.single(
                f"QuantConfig(quant_type={self.quant_type!r}): use 'nf4' or 'fp4'", key="quant_config.quant_type"
            )
        out: dict[str, Any] = {"kind": f"bnb-{self.bits}bit"}
        if self.bits == 4:
            out.update(quant_type=self.quant_type, double_quant=self.use_double_quant)
            compute = dtype_name(self.compute_dtype, "quant_config.compute_dtype")
            storage = self.quant_storage
            storage = (
                "uint8" if storage in (torch.uint8, "uint8") else dtype_name(storage, "quant_config.quant_storage")
            )
            out.update({k: v for k, v in (("compute_dtype", compute), ("storage_dtype", storage)) if v is not None})
        return out


@dataclass
class PeftConfig:
    """A LoRA (or DoRA) adapter -> [peft]."""

    enabled: bool = False
    r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    target_modules: Union[str, list[str]] = "all-linear"
    use_dora: bool = False

    def peft_fields(self, dora: bool = False) -> dict[str, Any]:
        if not self.enabled:
            return {}
        return dict(
            kind="dora" if (self.use_dora or dora) else "lora",
            r=self.r,
            alpha=float(self.lora_alpha),
            dropout=float(self.lora_dropout),
            target_modules=self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules),
        )


class ModelTransform:
    """A rewrite of the model after it is loaded (freeze layers, swap modules), the original's name
    for a model converter: subclass it and implement `transform(model) -> model`. It runs before
    the adapter (LoRA) and before parallelization."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def transform(self, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError(f"{type(self).__name__} must implement transform(model) -> model")

    def convert(self, model: torch.nn.Module) -> torch.nn.Module:
        """The ModelConverter protocol (ditty.models.converters)."""
        return self.transform(model)


class TokenizerFactory:
    """A Hugging Face tokenizer, built when the run starts: `TokenizerFactory("org/model").build()`.

    `token` (else HF_TOKEN) reaches huggingface_hub only; it is never written to the run directory.
    A tokenizer without a pad token gets `pad_token`, else its end-of-sequence token.
    """

    def __init__(
        self, tokenizer_path: str, pad_token: Optional[str] = None, token: Optional[str] = None, **load_kwargs
    ):
        self.tokenizer_path = tokenizer_path
        self.pad_token = pad_token
        self._token = token or os.environ.get("HF_TOKEN")
        self.load_kwargs = load_kwargs

    @classmethod
    def from_pretrained(cls, tokenizer_path: str, **kwargs: Any) -> "TokenizerFactory":
        return cls(tokenizer_path=tokenizer_path, **kwargs)

    def __repr__(self) -> str:  # never shows the token
        return f"TokenizerFactory({self.tokenizer_path!r})"

    def build(self) -> Any:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path, token=self._token, **self.load_kwargs)
        except (OSError, ValueError) as exc:
            raise RecipeError.single(
                f"cannot load the tokenizer {self.tokenizer_path!r}: {str(exc).splitlines()[0]}",
                key="tokenizer_factory",
                fix="give a local tokenizer directory or a hub id that can be fetched",
            ) from None
        if tokenizer.pad_token_id is None:
            if self.pad_token:
                tokenizer.pad_token = self.pad_token
            else:
                tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
