"""Names made from class names: the pipeline's stages and a composite loss's metrics."""

from __future__ import annotations

import re


def snake_case(name: str) -> str:
    """MSELoss -> "mse_loss", TokenMasker -> "token_masker" (the original Ditty's stage names)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
