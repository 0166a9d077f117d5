"""Building a module with parameters on the meta device (no storage) while its buffers stay real."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from torch import nn


@contextlib.contextmanager
def meta_init() -> Iterator[None]:
    """Create parameters on the meta device while buffers stay real.

    Buffers (rotary frequencies and the like) are small and often not in any checkpoint (not
    persistent), so they are computed as usual; parameters cost nothing until `materialize`.
    Plain `nn.Parameter`s only: subclasses (bitsandbytes' quantized ones) stay where they were made.
    """
    original = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original(module, name, param)
        if type(param) is nn.Parameter and param.device.type != "meta":
            moved = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
            moved.__dict__.update(param.__dict__)  # attributes libraries hang on parameters
            module._parameters[name] = moved

    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]
