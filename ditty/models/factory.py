"""Custom (non Hugging Face) models: `model.factory = "package.module:function"` returning an nn.Module.

The function is imported and its keyword arguments are bound before it is called, so a typo in the
reference or in `factory_kwargs` is a RecipeError, not a traceback from inside user code.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable

from ditty.config.errors import RecipeError
from ditty.config.references import import_reference

if TYPE_CHECKING:
    import torch


def import_factory(reference: str) -> Callable[..., Any]:
    """The callable "package.module:function" names (a class works too)."""
    factory = import_reference(reference, key="model.factory")
    if not callable(factory):
        raise RecipeError.single(
            f"{reference} is a {type(factory).__name__}, not a function or class",
            key="model.factory",
            fix="name a function (or nn.Module class) that builds the model",
        )
    return factory


def build_from_factory(reference: str, kwargs: dict[str, Any]) -> "torch.nn.Module":
    """Call the factory with `kwargs`; what it returns must be an nn.Module."""
    import torch

    factory = import_factory(reference)
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as error:
        raise RecipeError.single(
            f"{reference} does not accept these arguments: {error}",
            key="model.factory_kwargs",
            fix=f"match the parameters of {reference}{inspect.signature(factory)}",
        ) from error
    except ValueError:  # no signature to inspect (some builtins): let the call itself decide
        pass
    built = factory(**kwargs)
    if not isinstance(built, torch.nn.Module):
        raise RecipeError.single(
            f"{reference} returned {type(built).__name__}, not a torch.nn.Module",
            key="model.factory",
            fix="return the model instance from the factory",
        )
    return built
