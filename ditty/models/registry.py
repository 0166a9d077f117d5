"""Model specs: a named bundle of how to build, parallelize and train one architecture (torchtitan's ModelSpec).

A `ModelSpec` holds the model class (or factory) and its default configuration, the block classes
that FSDP2 shards one by one (and that activation checkpointing and per-block compile wrap), and
the loss the architecture trains with. A custom architecture registers one and gets ditty's
parallelism without touching ditty's core:

    MY_NET = register_model_spec(ModelSpec(
        name="my_net", build=MyNet, config={"width": 256},
        block_classes=("MyBlock",), loss="ditty.loss:MSELoss", contract="x:2:f32 -> y:2:f32"))

A recipe uses it through the existing factory field, with no new config:
`[model] factory = "my_pkg.models:MY_NET"` (factory_kwargs override `config`). A spec is callable
like any factory; the model it builds carries `_no_split_modules` (the blocks that FSDP2 shards and
that activation checkpointing and per-block compile wrap, read as for Hugging Face models) and
`ditty_spec`, through which the trainer takes the spec's loss when `[pipeline.loss]` is empty.
`model_spec(name)` looks a registered spec up by name; `model_specs()` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from ditty.config.errors import RecipeError

if TYPE_CHECKING:
    import torch

_REGISTRY: dict[str, "ModelSpec"] = {}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    """Registry name."""
    build: Callable[..., "torch.nn.Module"]
    """The model class or a factory function; called with `config` updated by the recipe's factory_kwargs."""
    config: dict[str, Any] = field(default_factory=dict)
    """Default keyword arguments of `build` (the model's configuration)."""
    block_classes: tuple[str, ...] = ()
    """Class names of the repeated blocks: each is one FSDP2 unit, one activation-checkpoint region
    (train.activation_checkpointing) and one compile unit (train.compile_scope = "blocks")."""
    loss: Union[str, Callable[[], Any], None] = None
    """"package.module:Class" of the LossCalculator (or a zero-argument callable making one); used
    when the recipe names none."""
    contract: Optional[str] = None
    """The model's contract (ditty.contracts syntax), checked in the pipeline chain."""
    description: str = ""

    def __call__(self, **overrides: Any) -> "torch.nn.Module":
        model = self.build(**{**self.config, **overrides})
        # ditty.parallel.wrap.find_blocks (FSDP2) and ditty.parallel.speed (checkpointing, compile)
        # fall back to the Hugging Face attribute when the recipe names no parallel.block_classes.
        model._no_split_modules = list(self.block_classes)
        model.ditty_spec = self
        if self.contract is not None and getattr(model, "contract", None) is None:
            model.contract = self.contract
        return model

    def make_loss(self) -> Any:
        """A fresh loss calculator, or None when the spec names none."""
        if self.loss is None:
            return None
        if isinstance(self.loss, str):
            from ditty.config.references import import_reference

            return import_reference(self.loss, key="pipeline.loss")()
        return self.loss()


def register_model_spec(spec: ModelSpec) -> ModelSpec:
    """Add a spec to the registry (a name registered twice with another spec is an error)."""
    existing = _REGISTRY.get(spec.name)
    if existing is not None and existing is not spec:
        raise ValueError(f"a model spec named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def model_spec(name: str) -> ModelSpec:
    if name not in _REGISTRY:
        raise RecipeError.single(
            f"no model spec named {name!r}",
            key="model.factory",
            fix="register it with ditty.models.registry.register_model_spec; known: "
            f"{', '.join(sorted(_REGISTRY)) or 'none'}",
        )
    return _REGISTRY[name]


def model_specs() -> dict[str, ModelSpec]:
    return dict(_REGISTRY)


def _digits_denoiser(**kwargs: Any) -> "torch.nn.Module":
    from ditty.models.denoiser import DigitsDenoiser

    return DigitsDenoiser(**kwargs)


DIGITS_DENOISER = register_model_spec(
    ModelSpec(
        name="digits_denoiser",
        build=_digits_denoiser,
        config={"hidden": 128, "depth": 3},
        block_classes=("ResidualBlock",),
        loss="ditty.loss:MSELoss",
        contract="x:4:f32, ctx.forward_kwargs.t:1:i64 -> eps:4:f32",
        description="The 8x8 digits DDPM denoiser (ditty.models.denoiser) as a spec.",
    )
)
"""`[model] factory = "ditty.models.registry:DIGITS_DENOISER"`: the bundled example spec."""
