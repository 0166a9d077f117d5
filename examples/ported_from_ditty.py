"""A script written for the original Ditty, run on ditty: only the original's public names.

Masked-token training of a small custom model: a preprocessor masks tokens and keeps the
originals in the context, another asks the model for its hidden states too; postprocessors move
the targets and the hidden states into the context; a CompositeLoss adds a masked cross-entropy
and a small penalty on the hidden states. Contracts use both placements of `|`: the
preprocessor's says what it ADDS to the context (after `->`), the losses' what they READ from it
(before `->`). The model trains through LoRA adapters on its linear layers, with 8-bit AdamW
(torchao's by default, which also runs on a CPU; it compiles its update on the first step, about
a minute there; optim_backend="bnb" takes bitsandbytes' instead).

The sequences count up (each token is the previous one plus one, modulo the vocabulary), so a
masked token can be read off its neighbours: the loss falls from ln(32) = 3.47.

    python -m examples.ported_from_ditty [OUTPUT_DIR] [MAX_STEPS]

Running it again with the same OUTPUT_DIR resumes from the newest checkpoint (or, once finished,
says so); `print_pipeline` shows the stages and their contracts before training starts.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from datasets import Dataset

from ditty import (
    CompositeLoss,
    Context,
    LossCalculator,
    LossOutput,
    ModelFactory,
    PeftConfig,
    Pipeline,
    PostProcessor,
    PreProcessor,
    print_pipeline,
)

VOCAB = 32
MASK_ID = 0  # never a real token: real tokens are 1..VOCAB-1


class TinyTokenModel(nn.Module):
    """Embeddings, a convolution over each token's neighbours, then a per-token MLP."""

    def __init__(self, vocab_size: int = VOCAB, dim: int = 128) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim)
        self.mix = nn.Conv1d(dim, dim, kernel_size=3, padding=1)
        self.encoder = nn.Linear(dim, dim)
        self.decoder = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor, return_hidden: bool = False):
        h = self.embedding(input_ids)
        h = h + self.mix(h.transpose(1, 2)).transpose(1, 2)
        hidden = torch.tanh(self.encoder(h))
        logits = self.decoder(hidden)
        return (logits, hidden) if return_hidden else (logits,)


class TokenMasker(PreProcessor):
    def __init__(self, mask_prob: float = 0.25) -> None:
        # the seed README's syntax: what the stage adds to the context goes after the outputs
        super().__init__(contract="batch:2:i64 -> batch:2:i64 | ctx.original_input_ids:2:i64, ctx.mask:2:f")
        self.mask_prob = mask_prob

    def config(self) -> dict[str, Any]:
        return {"mask_prob": self.mask_prob}

    def process(self, batch: torch.Tensor, ctx: Context):
        ctx["original_input_ids"] = batch.clone()
        mask = torch.rand(batch.shape, device=batch.device) < self.mask_prob
        ctx["mask"] = mask.float()
        return batch.masked_fill(mask, MASK_ID), ctx


class ForwardKwargsInjector(PreProcessor):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(contract="batch:2:i64 -> batch:2:i64")
        self.kwargs = kwargs

    def process(self, batch: Any, ctx: Context):
        ctx["forward_kwargs"] = ctx.get("forward_kwargs", {})
        ctx["forward_kwargs"].update(self.kwargs)
        return batch, ctx


class TargetExtractor(PostProcessor):
    def __init__(self) -> None:
        super().__init__(contract="logits:3:f, hidden:3:f -> logits:3:f, hidden:3:f | ctx.target:2:i64")

    def process(self, model_output, ctx: Context):
        ctx["target"] = ctx["original_input_ids"]
        return model_output, ctx


class HiddenStateExtractor(PostProcessor):
    def __init__(self) -> None:
        super().__init__(contract="logits:3:f, hidden:3:f -> logits:3:f, hidden:3:f | ctx.hidden_states:3:f")

    def process(self, model_output, ctx: Context):
        ctx["hidden_states"] = model_output[1]
        return model_output, ctx


class MaskedCrossEntropyLoss(LossCalculator):
    def __init__(self) -> None:
        # the original code's syntax: the context keys a loss reads come after a '|' before '->'
        super().__init__(
            output_index=0,
            target_key="target",
            mask_key="mask",
            contract="logits:3:f | ctx.target:2:i64, ctx.mask:2:f -> loss:0:f",
        )

    def compute(self, model_output, ctx: Context) -> LossOutput:
        logits, target, mask = self.get_prediction(model_output), self.get_target(ctx), self.get_mask(ctx)
        per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
        loss = (per_token * mask.reshape(-1)).sum() / mask.sum().clamp(min=1)
        return LossOutput(loss=loss, metrics={"masked_ce": loss.item()})


class HiddenRegularizer(LossCalculator):
    def __init__(self) -> None:
        super().__init__(contract="| ctx.hidden_states:3:f -> loss:0:f")

    def compute(self, model_output, ctx: Context) -> LossOutput:
        loss = ctx["hidden_states"].pow(2).mean()
        return LossOutput(loss=loss, metrics={"hidden_l2": loss.item()})


def counting_dataset(num_samples: int = 2048, seq_len: int = 16, seed: int = 0) -> Dataset:
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, VOCAB - 1, (num_samples, 1), generator=generator)
    rows = (starts + torch.arange(seq_len)) % (VOCAB - 1) + 1  # 1..VOCAB-1, counting up
    return Dataset.from_dict({"input_ids": rows.tolist()})


def collate(batch: list[dict]) -> torch.Tensor:
    return torch.tensor([item["input_ids"] for item in batch])


def build_pipeline(
    output_dir: str = "runs/ported_from_ditty", max_steps: int = 300, optim_backend: str = "torchao"
) -> Pipeline:
    torch.manual_seed(0)
    model_factory = ModelFactory(
        model=TinyTokenModel(),
        peft_config=PeftConfig(enabled=True, r=32, lora_alpha=64, target_modules=["encoder", "decoder"]),
        contract="batch:2:i64 -> logits:3:f, hidden:3:f",
    )
    return Pipeline(
        model_factory=model_factory,
        dataset=counting_dataset(),
        collate_fn=collate,
        preprocessors=[TokenMasker(), ForwardKwargsInjector(return_hidden=True)],
        postprocessors=[TargetExtractor(), HiddenStateExtractor()],
        loss_calculator=CompositeLoss([(MaskedCrossEntropyLoss(), 1.0), (HiddenRegularizer(), 0.01)]),
        output_dir=output_dir,
        fp16=False,
        use_8bit_optim=True,
        optim_backend=optim_backend,  # "torchao" (the default) or "bnb"; both run on a CPU
        lr=3e-3,
        batch_size=32,
        epochs=100,
        max_steps=max_steps,
        checkpoint_every=max(1, max_steps // 2),
        log_every=max(1, max_steps // 10),
        seed=0,
    )


def main(output_dir: str = "runs/ported_from_ditty", max_steps: int = 300, optim_backend: str = "torchao"):
    pipeline = build_pipeline(output_dir, max_steps, optim_backend)
    print_pipeline(pipeline)
    return pipeline.run()


if __name__ == "__main__":
    main(*sys.argv[1:2], *(int(a) for a in sys.argv[2:3]))
