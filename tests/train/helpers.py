"""Test components and config builders for the trainer tests (importable as tests.train.helpers)."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import torch

from ditty.config import TrainerConfig
from ditty.config.sections import (
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainConfig,
)
from ditty.processors import PostProcessor


def write_prompt_completion(path, n: int = 64) -> str:
    """Samples of different lengths: 'repeat <word>' -> the word reversed."""
    rows = []
    for i in range(n):
        word = "abcdefghijklmnop"[: 2 + i % 9] + str(i % 7)
        rows.append({"prompt": f"rev {word}=", "completion": word[::-1]})
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def write_chat(path, n: int = 48) -> str:
    rows = []
    for i in range(n):
        a, b = i % 10, (3 * i) % 10
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": "You add numbers."},
                    {"role": "user", "content": f"{a} plus {b}?"},
                    {"role": "assistant", "content": f"{a + b}"},
                ]
            }
        )
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def small_config(tmp_path, model_dir: str, data_path: str, **train) -> TrainerConfig:
    """A few-step recipe on a tiny pretrained-format model and a local jsonl file."""
    fmt = "chat" if "chat" in os.path.basename(data_path) else "prompt_completion"
    train_cfg = dict(steps=4, global_batch_size=8, micro_batch_size=4, log_every=1, eval_every=0, eval_samples=0)
    train_cfg.update(train)
    return TrainerConfig(
        run=RunConfig(name="test", output_dir=str(tmp_path / "run"), seed=0, device="cpu"),
        model=ModelConfig(path=model_dir),
        tokenizer=TokenizerConfig(),
        data=DataConfig(source="file", path=data_path, format=fmt, max_seq_len=64, val_fraction=0.125),
        train=TrainConfig(**train_cfg),
        optimizer=OptimizerConfig(lr=3e-3),
        scheduler=SchedulerConfig(kind="constant"),
        logging=LoggingConfig(progress=False),
    )


def with_train(config: TrainerConfig, **changes) -> TrainerConfig:
    return replace(config, train=replace(config.train, **changes))


class NaNLogits(PostProcessor):
    """Turns the logits into NaN at the given (0-based) optimizer steps, or at every step."""

    def __init__(self, steps=(), always: bool = False):
        super().__init__()
        self.steps, self.always = set(steps), always

    def process(self, model_output, ctx):
        if ctx.get("training") and (self.always or ctx["step"] in self.steps):
            model_output.logits = model_output.logits * torch.tensor(float("nan"))
        return model_output, ctx


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
