"""Data: tokenizers, sources, formats, built-in tasks and the batch stream.

Names load on first use (as in `ditty/__init__.py`), so importing `ditty.data.tokenizer` for a
fixture does not pull in `datasets`.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BatchStream": "ditty.data.batching",
    "DataBundle": "ditty.data.build",
    "Task": "ditty.data.task",
    "build_data": "ditty.data.build",
    "build_tokenizer": "ditty.data.tokenizer",
    "byte_tokenizer": "ditty.data.tokenizer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ditty.data' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_LAZY)
