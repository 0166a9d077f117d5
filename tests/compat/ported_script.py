"""A training script written against the original Ditty's public API; only its imports name ditty.

It uses the original's names as its README and docstrings do: ModelFactory with an FSDPConfig
(disabled here, one process; its transformer_layers say which blocks activation checkpointing
wraps), pre/postprocessors with contracts in both `|` placements, a composite loss whose weights
are learned (UncertaintyWeightedLoss), a MetricsLogger, a TokenizerFactory, checkpoints every
`checkpoint_every` steps, `max_steps`, and `print_pipeline`. tests/compat/test_coming_from_ditty.py runs it.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ditty import FSDPConfig, MetricsLogger, ModelFactory, Pipeline, TokenizerFactory, print_pipeline
from ditty.loss import LossCalculator, LossOutput, MSELoss, UncertaintyWeightedLoss
from ditty.processors import Context, PostProcessor, PreProcessor


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Denoiser(nn.Module):
    """forward(x, t) -> (eps, logits): a noise estimate and a 4-way classification of the row."""

    def __init__(self, dim: int = 8, depth: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(dim + 1, 32)
        self.blocks = nn.ModuleList(Block(32) for _ in range(depth))
        self.eps = nn.Linear(32, dim)
        self.cls = nn.Linear(32, 4)

    def forward(self, x, t):
        h = self.inp(torch.cat([x, t[:, None].float() / 10], dim=-1))
        for block in self.blocks:
            h = block(h)
        return self.eps(h), self.cls(h)


class AddNoise(PreProcessor):
    def __init__(self) -> None:
        super().__init__(
            contract="batch:2:f32 -> x:2:f32 | ctx.target:2:f32, ctx.label:1:i64, ctx.forward_kwargs.t:1:i64"
        )

    def process(self, batch, ctx: Context):
        x0, label = batch[:, :8], batch[:, 8].long()
        t = torch.randint(0, 10, (len(batch),))
        noise = torch.randn_like(x0)
        ctx["target"], ctx["label"] = noise, label
        ctx["forward_kwargs"] = {"t": t}
        return x0 + noise * (t[:, None] / 10), ctx


class PickClassLogits(PostProcessor):
    def __init__(self) -> None:
        super().__init__(contract="eps:2:f32, logits:2:f32 -> eps:2:f32, logits:2:f32 | ctx.logits:2:f")

    def process(self, model_output, ctx: Context):
        ctx["logits"] = model_output[1]
        return model_output, ctx


class ClassLoss(LossCalculator):
    def __init__(self) -> None:
        super().__init__(contract="| ctx.logits:2:f, ctx.label:1:i -> loss:0:f")

    def compute(self, model_output, ctx: Context) -> LossOutput:
        loss = F.cross_entropy(ctx["logits"], ctx["label"])
        return LossOutput(loss=loss, metrics={"ce": loss.item()})


def rows(count: int = 256) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(count, 8, generator=g)
    label = (x[:, 0] > 0).long() * 2 + (x[:, 1] > 0).long()
    return list(torch.cat([x, label[:, None].float()], dim=1))


def build(output_dir: str, max_steps: int, tokenizer_path: str, *, broken: bool = False) -> Pipeline:
    torch.manual_seed(0)
    model = Denoiser()
    model_factory = ModelFactory(
        model=model,
        fsdp_config=FSDPConfig(enabled=False, transformer_layers=[Block]),
        contract="x:2:f32, ctx.forward_kwargs.t:1:i64 -> eps:2:f32, logits:2:f32",
    )
    noise_loss = MSELoss(output_index=0, contract="eps:2:f | ctx.target:2:f -> loss:0:f")
    loss = UncertaintyWeightedLoss([noise_loss, ClassLoss()])
    return Pipeline(
        model_factory=model_factory,
        dataset=rows(),
        tokenizer_factory=TokenizerFactory(tokenizer_path),
        loss_calculator=loss,
        preprocessors=[] if broken else [AddNoise()],
        postprocessors=[PickClassLogits()],
        output_dir=output_dir,
        fp16=False,
        use_bfloat16=False,
        seed=0,
        batch_size=16,
        lr=1e-2,
        weight_decay=0.01,
        epochs=10,
        max_steps=max_steps,
        checkpoint_every=2,
        log_every=1,
        gradient_checkpointing=True,
        metrics_logger=MetricsLogger(output_dir, use_tensorboard=True),
    )


def main(output_dir: str, max_steps: int, tokenizer_path: str):
    pipeline = build(output_dir, max_steps, tokenizer_path)
    print_pipeline(pipeline)
    pipeline.run()
    return pipeline
