"""A custom model trained through the Python API, with contracts checked before anything runs.

A small regression: the batch is a [B, 5] tensor whose last column is the target. A preprocessor
splits it (and says so in its contract), the model maps x [B, 4] to y [B, 1], MSELoss compares.
`Pipeline(...)` checks the chain preprocessors -> model -> loss when it is constructed; a stage that
does not fit (try `rank=3` below) stops there with the stage named, before any training.

    python -m examples.custom_pipeline [OUTPUT_DIR] [STEPS]
"""

from __future__ import annotations

import sys

import torch

from ditty.loss import MSELoss
from ditty.pipeline import ModelFactory, Pipeline
from ditty.processors import Context, PreProcessor


class SplitTarget(PreProcessor):
    """[B, 5] rows -> features [B, 4] for the model, the last column as ctx["target"] [B, 1]."""

    def __init__(self, rank: int = 2) -> None:
        super().__init__(contract=f"rows:2:f32 -> x:{rank}:f32 | ctx.target:2:f32")

    def process(self, batch: torch.Tensor, ctx: Context):
        ctx["target"] = batch[:, 4:]
        return batch[:, :4], ctx


class Regressor(torch.nn.Module):
    contract = "x:2:f32 -> y:2:f32"

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, hidden)
        self.fc2 = torch.nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def make_rows(count: int = 512, seed: int = 0) -> list[torch.Tensor]:
    """y = x0 - 2 x1 + x2 x3: learnable by a small MLP."""
    x = torch.randn(count, 4, generator=torch.Generator().manual_seed(seed))
    y = x[:, :1] - 2 * x[:, 1:2] + x[:, 2:3] * x[:, 3:4]
    return list(torch.cat([x, y], dim=1))


def main(output_dir: str = "runs/custom_pipeline", steps: int = 200, **overrides):
    pipeline = Pipeline(
        model_factory=ModelFactory.from_instance(Regressor()),
        dataset=make_rows(),
        val_dataset=make_rows(128, seed=1),
        loss_calculator=MSELoss(contract="y:2:f32, ctx.target:2:f32 -> loss:0:f32"),
        preprocessors=[SplitTarget()],
        output_dir=output_dir,
        lr=3e-3,
        steps=steps,
        batch_size=32,
        grad_accum=2,  # global batch = 32 x 2 x data-parallel size
        device="cpu",
        num_threads=1,  # tiny matmuls: one thread beats two on a shared CPU
        progress=False,
        log_every=max(1, steps // 5),
        **overrides,
    )
    return pipeline.run()


if __name__ == "__main__":
    main(*sys.argv[1:2], *(int(a) for a in sys.argv[2:3]))
