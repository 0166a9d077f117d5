"""How the Python API gets its model: `ModelFactory` and the original Ditty's config objects.

    ModelFactory.from_instance(model, fsdp_config=FSDPConfig(enabled=True, transformer_layers=[Block]))
    ModelFactory.from_checkpoint("runs/x/final", MyNet, hidden=64)      # weights into MyNet(hidden=64)
    ModelFactory.from_huggingface("org/model", quant_config=QuantConfig(enabled=True),
                                  peft_config=PeftConfig(enabled=True, r=16))
    ModelFactory(model=net, peft_config={"enabled": True, "target_modules": ["fc1"]})

Nothing here builds a second training path: every setting maps onto a recipe section that the
compiler checks and the Trainer builds (`recipe_overrides`): FSDPConfig -> [parallel],
QuantConfig -> [quant], PeftConfig -> [peft], a Hugging Face model -> [model] path (the Trainer
loads it, quantized and on the meta device where the recipe says so), `use_compile` -> [train]
compile, and a `ModelTransform` is a model converter (ditty.models.converters) that runs first,
before the adapter, as the original applied it. `build()` gives the model without a run, as the
original's did: loaded, quantized, transformed and with its adapter, through the same builders
(ditty.models.build_model, ditty.models.adapters.LoraConverter). Each config also accepts a dict; an unknown key
or a value ditty cannot honour is a RecipeError that names it and says what to use instead.
Defaults are ditty's (docs/python-api/coming-from-ditty.md), not the original's. The config objects live
in ditty.compat.model_configs and are re-exported here, where the original kept them.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Callable, Optional, Union

import torch

from ditty.compat.model_configs import (
    FSDPConfig,
    ModelTransform,
    PeftConfig,
    QuantConfig,
    TokenizerFactory,
    dtype_name,
    from_dict,
)
from ditty.config.errors import RecipeError

__all__ = ["FSDPConfig", "ModelFactory", "ModelTransform", "PeftConfig", "QuantConfig", "TokenizerFactory"]

# --------------------------------------------------------------------------------- ModelFactory

# load_kwargs of from_huggingface that have a [model] field, and the field.
_HF_LOAD_KWARGS = {"torch_dtype": "dtype", "dtype": "dtype", "trust_remote_code": "trust_remote_code"}
_HF_LOAD_KWARGS["attn_implementation"] = "attn_implementation"


class ModelFactory:
    """The model of a Pipeline: an instance, a class with weights from a file, or a Hugging Face
    model the Trainer loads (see the module docstring). Arguments are the original Ditty's."""

    def __init__(
        self,
        model: Optional[torch.nn.Module] = None,
        model_path: Optional[str] = None,
        model_class: Optional[type] = None,
        fsdp_config: Union[FSDPConfig, dict, None] = None,
        quant_config: Union[QuantConfig, dict, None] = None,
        peft_config: Union[PeftConfig, dict, None] = None,
        load_kwargs: Optional[dict] = None,
        contract: Optional[str] = "",
        model_transform: Optional[ModelTransform] = None,
        use_compile: bool = False,
        compile_mode: str = "default",
        *,
        strict: bool = True,
    ) -> None:
        self.fsdp_config = from_dict(FSDPConfig, fsdp_config, "fsdp_config")
        self.quant_config = from_dict(QuantConfig, quant_config, "quant_config")
        self.peft_config = from_dict(PeftConfig, peft_config, "peft_config")
        self.load_kwargs = dict(load_kwargs or {})
        self.model_transform = model_transform
        self.use_compile = use_compile
        self.compile_mode = compile_mode
        self.model_path = model_path
        self.model_class = model_class
        self.strict = strict
        self.hub_path: Optional[str] = None
        """Set when the Trainer loads a Hugging Face model from this path ([model] path)."""
        self._build: Optional[Callable[[], torch.nn.Module]] = None
        self._given = model
        if model is not None:
            if not isinstance(model, torch.nn.Module):
                raise RecipeError.single(f"model is a {type(model).__name__}, not an nn.Module", key="model_factory")
            self._build, self.description = (lambda: model), type(model).__qualname__
            source: Any = model
        elif model_path is not None and _is_hugging_face(model_class, model_path):
            self.hub_path, self.description = model_path, f"{_class_name(model_class)} from {model_path}"
            source = model_class
        elif model_class is not None:
            self._build = self._class_builder(model_class, model_path)
            where = f" from {model_path}" if model_path else ""
            self.description, source = f"{model_class.__qualname__}{where}", model_class
        else:
            raise RecipeError.single(
                "ModelFactory needs a model, a model_path, or a model_class",
                key="model_factory",
                fix="ModelFactory.from_instance(model), .from_checkpoint(path, cls) or .from_huggingface(model_id)",
            )
        self.contract = contract or getattr(source, "contract", None)

    # -- the original's constructors

    @classmethod
    def from_instance(
        cls,
        model: torch.nn.Module,
        fsdp_config: Union[FSDPConfig, dict, None] = None,
        use_compile: bool = False,
        compile_mode: str = "default",
    ) -> "ModelFactory":
        return cls(model=model, fsdp_config=fsdp_config, use_compile=use_compile, compile_mode=compile_mode)

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint_path: Optional[str],
        model_class: type,
        fsdp_config: Union[FSDPConfig, dict, None] = None,
        model_transform: Optional[ModelTransform] = None,
        use_compile: bool = False,
        compile_mode: str = "default",
        *,
        strict: bool = True,
        **model_kwargs: Any,
    ) -> "ModelFactory":
        """`model_class(**model_kwargs)` with weights from `checkpoint_path`: a .safetensors file, a
        directory holding model.safetensors (a run's final/), or a torch file read with
        `weights_only=True` (never unpickling code). A {"model": ...}, {"state_dict": ...} or
        {"model_state_dict": ...} wrapper is unwrapped. A Hugging Face class with a model directory
        loads through the Trainer instead."""
        if (
            checkpoint_path is not None
            and not os.path.exists(checkpoint_path)
            and not _is_hugging_face(model_class, checkpoint_path)
        ):
            raise RecipeError.single(
                f"checkpoint {checkpoint_path!r} does not exist",
                key="model_factory",
                fix="give the path of a weights file or a run's final/",
            )
        return cls(
            model_path=checkpoint_path,
            model_class=model_class,
            fsdp_config=fsdp_config,
            load_kwargs=model_kwargs,
            model_transform=model_transform,
            use_compile=use_compile,
            compile_mode=compile_mode,
            strict=strict,
        )

    @classmethod
    def from_huggingface(
        cls,
        model_path: Union[str, dict],
        fsdp_config: Union[FSDPConfig, dict, None] = None,
        quant_config: Union[QuantConfig, dict, None] = None,
        peft_config: Union[PeftConfig, dict, None] = None,
        model_transform: Optional[ModelTransform] = None,
        use_compile: bool = False,
        compile_mode: str = "default",
        load_kwargs: Optional[dict] = None,
        **more_load_kwargs: Any,
    ) -> "ModelFactory":
        """A causal LM the Trainer loads from a hub id or a local directory ([model] path)."""
        kwargs = dict(load_kwargs or {})
        if isinstance(model_path, dict):  # the original's ModelConfig as a dict
            spec = dict(model_path)
            kwargs = {**spec.pop("load_kwargs", {}), **kwargs}
            extra = {k: v for k, v in spec.items() if k != "model_path" and v not in (None, False)}
            if extra:
                raise RecipeError.single(
                    f"from_huggingface: {', '.join(sorted(extra))} not supported",
                    key="model_factory",
                    fix="ditty loads causal LMs (AutoModelForCausalLM); give model_path alone",
                )
            model_path = spec["model_path"]
        kwargs.update(more_load_kwargs)
        from transformers import AutoModelForCausalLM

        return cls(
            model_path=model_path,
            model_class=AutoModelForCausalLM,
            fsdp_config=fsdp_config,
            quant_config=quant_config,
            peft_config=peft_config,
            load_kwargs=kwargs,
            model_transform=model_transform,
            use_compile=use_compile,
            compile_mode=compile_mode,
        )

    # -- the model

    def build(self, device: Any = None) -> torch.nn.Module:
        """The model ready to train, as the original's `build()` returned it: loaded (a Hugging Face
        model quantized as `quant_config` asks, on `device`: default CUDA when there is one, else
        CPU), then its `model_transform`, then its adapter (`peft_config`: LoRA/DoRA layers
        trainable, the base frozen). Sharding (`fsdp_config`) and `use_compile` belong to a run and
        are applied by `Pipeline(...).run()`.

        A given instance that a transform or an adapter would change is copied first: `model`
        itself stays as it was, so the factory can still hand it to a Pipeline, whose Trainer
        applies the same transform and adapter. Each call builds a new model."""
        from ditty._utils.quiet import known_warnings_ignored
        from ditty.models.quiet_io import model_bars_quiet

        with known_warnings_ignored(), model_bars_quiet():  # the libraries' noise, unless verbose
            return self._build_ready(device)

    def _build_ready(self, device: Any) -> torch.nn.Module:
        overrides = self.recipe_overrides()  # every setting checked as for a Pipeline, before loading
        changes = self.converters() + self._adapter(overrides)
        if self.hub_path is not None:
            model = self._load_hugging_face(overrides, device)
        else:
            model = self.base_model()
            if changes and self._given is not None:
                model = copy.deepcopy(model)
        for change in changes:
            model = change.convert(model)
        return model

    def base_model(self) -> torch.nn.Module:
        """The model before its transform and adapter, which a Pipeline's Trainer applies: the
        instance given, or the class with its weights loaded. A Hugging Face model given by path
        has none here (the Trainer loads it); `build()` loads one."""
        if self._build is None:
            raise RecipeError.single(
                f"the Hugging Face model {self.hub_path!r} is loaded when it is built or run",
                key="model_factory",
                fix="call build() for the model with its quantization and adapter, or run it through a Pipeline",
            )
        model = self._build()
        if not isinstance(model, torch.nn.Module):
            raise RecipeError.single(
                f"the model factory returned {type(model).__name__}, not an nn.Module", key="model_factory"
            )
        return model

    def _adapter(self, overrides: dict[str, dict[str, Any]]) -> list:
        """[LoraConverter] for the [peft] section this factory stands for; [] without one."""
        if "peft" not in overrides:
            return []
        from ditty.config import sections
        from ditty.models.adapters import LoraConverter

        peft = dataclasses.replace(sections.PeftConfig(), **overrides["peft"])
        return [LoraConverter(peft, task=overrides.get("model", {}).get("task", "causal-lm"))]

    def _load_hugging_face(self, overrides: dict[str, dict[str, Any]], device: Any) -> torch.nn.Module:
        """The [model] and [quant] sections built as a recipe's are (ditty.models.build_model)."""
        from ditty.config import sections
        from ditty.models import build_model

        model = dataclasses.replace(sections.ModelConfig(), **overrides["model"])
        quant = dataclasses.replace(sections.QuantConfig(), **overrides.get("quant", {}))
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return build_model(model, device=device, quant=quant)

    def recipe_overrides(self) -> dict[str, dict[str, Any]]:
        """{section: {field: value}} of the recipe sections this factory stands for."""
        quant = self.quant_config.quant_fields()
        peft = self.peft_config.peft_fields(dora=self.quant_config.enabled and self.quant_config.use_dora)
        if quant and self.hub_path is None:
            raise RecipeError.single(
                "QuantConfig applies to Hugging Face models loaded by path, not to a model instance or class",
                key="quant_config",
                fix="use ModelFactory.from_huggingface(model_id, quant_config=...), or quantize the model yourself",
            )
        out: dict[str, dict[str, Any]] = {"parallel": self.fsdp_config.parallel_fields()}
        if quant:
            out["quant"] = quant
        if peft:
            out["peft"] = peft
        if self.use_compile:
            out["train"] = {"compile": True, "compile_scope": "model", "compile_mode": self.compile_mode}
        if self.hub_path is not None:
            out["model"] = {"path": self.hub_path, **self._model_fields()}
        return out

    def converters(self) -> list:
        return [self.model_transform] if self.model_transform is not None else []

    # -- helpers

    def _model_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.load_kwargs.items():
            if key not in _HF_LOAD_KWARGS:
                raise RecipeError.single(
                    f"load_kwargs {key!r} is not supported",
                    key=f"load_kwargs.{key}",
                    fix=f"supported: {', '.join(sorted(_HF_LOAD_KWARGS))}; a hub token comes from HF_TOKEN or "
                    "`hf auth login`, never from a recipe",
                )
            out[_HF_LOAD_KWARGS[key]] = dtype_name(value, f"load_kwargs.{key}") if key.endswith("dtype") else value
        return out

    def _class_builder(self, model_class: type, path: Optional[str]) -> Callable[[], torch.nn.Module]:
        kwargs, strict = self.load_kwargs, self.strict

        def build() -> torch.nn.Module:
            model = model_class(**kwargs)
            if path is None:
                return model
            state = {k: v for k, v in load_weights(path).items() if not k.startswith(LOSS_PREFIX)}
            missing, unexpected = model.load_state_dict(state, strict=False)
            if strict and (missing or unexpected):
                raise RecipeError.single(
                    f"{path} does not fit {model_class.__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}",
                    key="model_factory",
                    fix="pass the model_class and kwargs the checkpoint was saved from, or strict=False",
                )
            return model

        return build


LOSS_PREFIX = "ditty_loss."
"""Weights of a loss with parameters, saved with a custom model (ditty.stages.loss_parameters)."""


def _is_hugging_face(model_class: Optional[type], path: str) -> bool:
    """A model the Trainer loads by path: a transformers class (or none) and a hub id or model dir."""
    if model_class is not None and not hasattr(model_class, "from_pretrained"):
        return False
    if os.path.isfile(path) or path.endswith((".pt", ".pth", ".bin", ".safetensors")):
        return False
    return not os.path.isdir(path) or os.path.isfile(os.path.join(path, "config.json"))


def _class_name(model_class: Optional[type]) -> str:
    return getattr(model_class, "__name__", "AutoModelForCausalLM")


def load_weights(path: str) -> dict[str, torch.Tensor]:
    if os.path.isdir(path):
        for name in ("model.safetensors", "pytorch_model.bin", "model.pt"):
            if os.path.exists(os.path.join(path, name)):
                return load_weights(os.path.join(path, name))
        raise RecipeError.single(
            f"{path} holds no model.safetensors, pytorch_model.bin or model.pt", key="model_factory"
        )
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refuses pickled code: say so rather than unpickle it
        raise RecipeError.single(
            f"cannot read {path} as plain weights: {exc}",
            key="model_factory",
            fix="save a state_dict (torch.save(model.state_dict(), ...)) or safetensors",
        ) from None
    for wrapper in ("model", "state_dict", "model_state_dict"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    return state
