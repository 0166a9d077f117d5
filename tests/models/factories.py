"""Model factories that tests name in `model.factory` ("tests.models.factories:tiny_mlp")."""

import torch


def tiny_mlp(width: int = 8, depth: int = 2) -> torch.nn.Module:
    layers = [torch.nn.Linear(width, width) for _ in range(depth)]
    return torch.nn.Sequential(*layers)


def not_a_module(width: int = 8):
    return {"width": width}
