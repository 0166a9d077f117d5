"""The model converter that gives a causal LM its MTP heads (`[mtp] depth` > 0).

It runs last among the converters (ditty.models.recipe_model.converters_for), after the adapter: the
heads are new weights, trained in full beside a LoRA adapter rather than through one. The heads are
those the model directory already holds when it holds some (a ditty run's final/, or the MTP layers
a DeepSeek-V3 or GLM-4.5 checkpoint ships; ditty.models.mtp.weights), else freshly initialised.
A depth beyond what the directory holds starts fresh.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from ditty._utils.dist import is_main_process
from ditty.models.mtp.heads import attach_heads, build_heads

log = logging.getLogger("ditty.models")


class MTPConverter:
    name = "mtp"

    def __init__(self, depth: int, source_dir: Optional[str] = None) -> None:
        self.depth = depth
        self.source_dir = source_dir
        """The local directory the trunk was loaded from (None: a random or in-memory model)."""

    def convert(self, model: Any) -> Any:
        from ditty.models.mtp.weights import load_heads

        heads = build_heads(model, self.depth)
        loaded = load_heads(heads, model, self.source_dir) if self.source_dir else 0
        if loaded and is_main_process():
            fresh = f"; depths {loaded + 1}-{self.depth} start fresh" if loaded < self.depth else ""
            log.info("MTP heads: depths 1-%d loaded from %s%s", loaded, self.source_dir, fresh)
        return attach_heads(model, heads)
