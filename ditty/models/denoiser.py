"""A small noise-prediction network for 8x8 single-channel images (scikit-learn's digits).

An MLP over the 64 pixels with a sinusoidal timestep embedding added in every residual block.
At this size an MLP trains faster on a CPU than a conv net and is enough to produce legible
digits in about a minute; it is a demonstration model, not a general image denoiser.

Use it from a recipe as `[model] factory = "ditty.models.denoiser:digits_denoiser"`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

CONTRACT = "x:4:f32, ctx.forward_kwargs.t:1:i64 -> eps:4:f32"
"""What the model takes and gives, in ditty.contracts syntax: images [B, 1, 8, 8] and timesteps [B]
(passed as the keyword argument t), and a noise prediction shaped like the images."""


def sinusoidal_embedding(t: torch.Tensor, dim: int, max_period: float = 10_000.0) -> torch.Tensor:
    """Transformer-style position encoding of integer timesteps: [B] -> [B, dim].

    Frequencies span 1 to 1/max_period, so both neighbouring and distant timesteps are told apart.
    """
    half = dim // 2
    frequencies = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = t.float()[:, None] * frequencies[None, :]
    embedding = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return nn.functional.pad(embedding, (0, dim % 2))


class ResidualBlock(nn.Module):
    """h + MLP(norm(h) + time), so every depth sees the timestep and gradients flow straight through."""

    def __init__(self, hidden: int, time_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.time = nn.Linear(time_dim, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden * 2), nn.SiLU(), nn.Linear(hidden * 2, hidden))

    def forward(self, h: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(self.norm(h) + self.time(time))


class DigitsDenoiser(nn.Module):
    """forward(x, t) -> predicted noise, shaped like x.

    x: [B, channels, size, size] (or already flat [B, channels*size*size]); t: [B] integer
    timesteps, or one int for the whole batch.
    """

    contract = CONTRACT

    def __init__(
        self, image_size: int = 8, channels: int = 1, hidden: int = 128, depth: int = 3, time_dim: int = 64
    ) -> None:
        super().__init__()
        pixels = channels * image_size * image_size
        self.time_dim = time_dim
        self.time_mlp = nn.Sequential(nn.Linear(time_dim, time_dim), nn.SiLU(), nn.Linear(time_dim, time_dim))
        self.input = nn.Linear(pixels, hidden)
        self.blocks = nn.ModuleList(ResidualBlock(hidden, time_dim) for _ in range(depth))
        self.output = nn.Sequential(nn.LayerNorm(hidden), nn.SiLU(), nn.Linear(hidden, pixels))
        # A zero last layer predicts zero noise at first: the loss starts at about 1 (the noise
        # variance) instead of a random-feature value, a steadier start for a short run.
        nn.init.zeros_(self.output[-1].weight)
        nn.init.zeros_(self.output[-1].bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor | int) -> torch.Tensor:
        t = torch.as_tensor(t, device=x.device)
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        time = self.time_mlp(sinusoidal_embedding(t, self.time_dim))
        h = self.input(x.reshape(x.shape[0], -1))
        for block in self.blocks:
            h = block(h, time)
        return self.output(h).reshape(x.shape)


def digits_denoiser(
    image_size: int = 8, channels: int = 1, hidden: int = 128, depth: int = 3, time_dim: int = 64
) -> DigitsDenoiser:
    """Model factory for recipes: `[model] factory = "ditty.models.denoiser:digits_denoiser"`."""
    return DigitsDenoiser(image_size=image_size, channels=channels, hidden=hidden, depth=depth, time_dim=time_dim)


digits_denoiser.contract = CONTRACT  # readable by the recipe compiler without building the model
