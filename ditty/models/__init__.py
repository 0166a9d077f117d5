"""Models: build what `[model]` describes, check its source offline, and know what each model supports.

Importing this package is cheap (no torch, no transformers): the recipe compiler imports it for
`check_model_source`; the heavy libraries load inside `build_model`.
"""

from ditty.models.build import build_model
from ditty.models.factory import build_from_factory, import_factory
from ditty.models.packing import supports_packed_attention
from ditty.models.source import check_model_source, looks_like_hub_id, read_model_type

__all__ = [
    "build_from_factory",
    "build_model",
    "check_model_source",
    "import_factory",
    "looks_like_hub_id",
    "read_model_type",
    "supports_packed_attention",
]
