"""The stages around `model.forward`: batch -> preprocessors -> model -> postprocessors -> loss.

A `Context` travels with one micro-batch through every stage, so a stage can leave something for a
later one (a diffusion timestep for the loss, a target computed from the output) without changing
the model's signature.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Optional

from ditty._utils.names import snake_case


class Context(dict):
    """A dict shared by the stages of one micro-batch.

    Keys with a fixed meaning:
    - "forward_kwargs": extra keyword arguments for `model.forward` (always present, {} at first).
    - "original_batch": the batch as the data loader produced it, before any preprocessor.
    - "batch": the batch after the preprocessors, as the model received it.
    The trainer adds run facts (step, training, device ...); stages add whatever they declare in
    their contract's `ctx.` part.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setdefault("forward_kwargs", {})

    @property
    def forward_kwargs(self) -> dict[str, Any]:
        return self["forward_kwargs"]

    @property
    def original_batch(self) -> Any:
        return self.get("original_batch")


class PreProcessor(ABC):
    """Transforms a batch before the model sees it (add noise, draw timesteps, set forward kwargs).

    `contract` is the terse shape/dtype declaration ("batch:3:i64 -> batch:3:i64 | ctx.t:1:i64")
    that the recipe compiler checks against the neighbouring stages; None (or "") means unchecked.
    `name` names the stage in `print_pipeline` (default: the class name in snake_case).
    """

    def __init__(self, contract: Optional[str] = None, name: str = "") -> None:
        self.contract = contract
        self.name = name or snake_case(type(self).__name__)

    def config(self) -> dict[str, Any]:
        """Settings worth showing next to the stage's name (the original Ditty's hook; {} here)."""
        return {}

    @abstractmethod
    def process(self, batch: Any, ctx: Context) -> tuple[Any, Context]:
        """Return the batch for the next stage and the (possibly updated) context."""


class PostProcessor(ABC):
    """Transforms the model's output before the loss (pick a head, compute a target from it).

    `contract` and `name` as for PreProcessor.
    """

    def __init__(self, contract: Optional[str] = None, name: str = "") -> None:
        self.contract = contract
        self.name = name or snake_case(type(self).__name__)

    def config(self) -> dict[str, Any]:
        """Settings worth showing next to the stage's name (the original Ditty's hook; {} here)."""
        return {}

    @abstractmethod
    def process(self, model_output: Any, ctx: Context) -> tuple[Any, Context]:
        """Return the output for the next stage and the (possibly updated) context."""
