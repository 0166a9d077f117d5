"""A user model converter for the tests (named in recipes as tests.train.converter_hooks:FreezeEmbeddings)."""

from __future__ import annotations

import torch


class FreezeEmbeddings:
    """Freezes the input embedding (a real rewrite: the optimizer then never sees it) and counts the
    optimizer steps through the optional post-optimizer hook."""

    name = "freeze-embeddings"

    def __init__(self) -> None:
        self.steps = 0

    def convert(self, model: torch.nn.Module) -> torch.nn.Module:
        model.get_input_embeddings().weight.requires_grad_(False)
        return model

    def post_optimizer_hook(self, model: torch.nn.Module) -> None:
        self.steps += 1


class NotAConverter:
    pass
