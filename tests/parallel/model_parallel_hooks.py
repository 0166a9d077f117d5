"""A Trainer that also writes each step's gradients (whole tensors, before clipping) on rank 0, for
the tensor/context-parallel parity tests; and the recipes those tests run."""

from __future__ import annotations

import os

import torch

from ditty.config import TrainerConfig
from ditty.config.outputs import CheckpointConfig
from ditty.config.sections import (
    ComponentSpec,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PeftConfig,
    PipelineConfig,
    RunConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainConfig,
)
from ditty.train import Trainer


class GradientRecorder(Trainer):
    """`grads-N.pt` in the run directory: step N's gradients by parameter name (collective: under FSDP2
    and tensor parallel each is gathered from its shards)."""

    def optimizer_step(self, totals, metrics):
        from torch.distributed.tensor import DTensor

        from ditty._utils.dist import is_main_process
        from ditty.parallel.materialize import clean_name

        grads = {}
        for name, param in self.engine.unwrap(self.model).named_parameters():
            if param.grad is not None:
                grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
                grads[clean_name(name)] = grad.detach().clone()
        if is_main_process():
            torch.save(grads, os.path.join(self.config.run.output_dir, f"grads-{self.state.step + 1}.pt"))
        return super().optimizer_step(totals, metrics)


class ActivationMeter(Trainer):
    """`activations-rank-R.jsonl` in the run directory: per training micro-batch, the bytes autograd
    saved for the backward during the forward and the loss (each storage once; the 0.4 MB of weights
    the layers save are in it too), and the tokens of the micro-batch on this rank."""

    def forward(self, batch, ctx):
        if not ctx.get("training"):
            return super().forward(batch, ctx)
        import json

        import torch

        from ditty._utils.dist import rank

        storages: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = super().forward(batch, ctx)
        record = {"saved_bytes": sum(storages.values()), "tokens": int(batch["input_ids"].numel())}
        path = os.path.join(self.config.run.output_dir, f"activations-rank-{rank()}.jsonl")
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        return out


def recipe(out: str, model_dir: str, *, kind: str = "none", micro: int = 4, steps: int = 3, **changes):
    """A tiny run on the built-in addition data: fp32, no dropout, global batch 8, clipping at 1.0.
    `changes`: {"train": {...}, "parallel": {...}, "data": {...}, "optimizer": {...}, "peft": {...},
    "checkpoint": {...}} fields over these defaults, and "preprocessors": ["module:Class", ...]."""
    train = dict(steps=steps, global_batch_size=8, micro_batch_size=micro, max_grad_norm=1.0, log_every=1)
    train.update(eval_every=0, eval_samples=0)
    train.update(changes.get("train", {}))
    data = dict(source="builtin", name="addition", format="prompt_completion", max_seq_len=32, num_samples=200)
    data.update(val_fraction=0.05)
    data.update(changes.get("data", {}))
    return TrainerConfig(
        run=RunConfig(name="mp", output_dir=out, seed=0, device="cpu"),
        model=ModelConfig(path=model_dir),
        tokenizer=TokenizerConfig(kind="byte"),
        data=DataConfig(**data),
        train=TrainConfig(**train),
        optimizer=OptimizerConfig(**{"lr": 3e-3, **changes.get("optimizer", {})}),
        scheduler=SchedulerConfig(kind="constant"),
        parallel=ParallelConfig(kind=kind, **changes.get("parallel", {})),
        peft=PeftConfig(**changes.get("peft", {})),
        checkpoint=CheckpointConfig(**changes.get("checkpoint", {})),
        pipeline=PipelineConfig(preprocessors=[ComponentSpec(use=use) for use in changes.get("preprocessors", [])]),
        logging=LoggingConfig(progress=False),
    )


TRAINERS = {"plain": Trainer, "gradients": GradientRecorder, "activations": ActivationMeter}


def train_all(rank: int, world: int, configs: list, trainers: list) -> list[int]:
    """One spawn, several runs in turn, each with its Trainer class (a TRAINERS name); returns the step
    each run resumed from (0: a fresh start)."""
    resumed = []
    for config, trainer in zip(configs, trainers):
        run = TRAINERS[trainer](config)
        resumed.append(run.resume.step)
        run.train()
    return resumed


def train_killed_at(rank: int, world: int, config, at: str) -> None:
    """Train with tests.train.resume_hooks:SignalAt armed: every rank kills itself (SIGKILL) at `at`
    ("STEP:MICRO:KILL"), the way a kill -9 of the job would end it."""
    from tests.train.resume_hooks import ENV

    os.environ[ENV] = at
    Trainer(config).train()
