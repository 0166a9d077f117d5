"""Decoding outside a run's compiled blocks.

`train.compile` compiles the blocks for training's shapes. Token-by-token decoding (held-out
generation, on-policy sampling with `generate`) calls them with a new length and a KV cache of new
strides at every token: dynamo recompiles each time until its `recompile_limit` (8), warns, and runs
them eagerly anyway. Decoding eagerly from the start skips those compiles and their warnings.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def eager_decoding() -> Iterator[None]:
    import torch

    with torch.compiler.set_stance("force_eager"):
        yield
