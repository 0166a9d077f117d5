"""Recipes of the model-task tests: one small config per (task, model family, adapter or not)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from ditty.config import TrainerConfig
from ditty.config.sections import (
    CheckpointConfig,
    ComponentSpec,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    PeftConfig,
    PipelineConfig,
    RunConfig,
    SchedulerConfig,
    TrainConfig,
)
from ditty.models.tasks import model_task


@dataclass(frozen=True)
class Case:
    task: str
    family: str
    adapter: bool = False

    @property
    def id(self) -> str:
        return f"{self.task}-{self.family}" + ("-lora" if self.adapter else "")


# Every task with and without an adapter, on the families that have it; adapters also write final/merged/.
CASES = (
    Case("seq-classification", "bert"),
    Case("seq-classification", "deberta-v2", adapter=True),
    Case("token-classification", "distilbert"),
    Case("token-classification", "roberta", adapter=True),
    Case("seq2seq", "t5"),
    Case("seq2seq", "bart", adapter=True),
    Case("masked-lm", "roberta"),
    Case("masked-lm", "bert", adapter=True),
)


def task_config(
    output_dir: Path,
    case: Case,
    model_dirs: dict,
    files: dict,
    *,
    steps: int = 2,
    micro: int = 4,
    every: int = 0,
    signal_hook: bool = False,
    parallel: Optional[str] = None,
) -> TrainerConfig:
    fmt = model_task(case.task).data_formats[0]
    config = TrainerConfig(
        run=RunConfig(name=case.id, output_dir=str(output_dir), seed=0, device="cpu", num_threads=1),
        model=ModelConfig(path=model_dirs[case.family], task=case.task),
        data=DataConfig(source="file", path=files[fmt], val_path=files[f"{fmt}_val"], format=fmt, max_seq_len=32),
        train=TrainConfig(
            steps=steps, global_batch_size=8, micro_batch_size=micro, log_every=1, eval_samples=6, max_grad_norm=1.0
        ),
        optimizer=OptimizerConfig(lr=3e-3),
        scheduler=SchedulerConfig(kind="cosine", warmup_steps=1),
        checkpoint=CheckpointConfig(every=every, final_format="merged" if case.adapter else "auto"),
        logging=LoggingConfig(progress=False),
    )
    if case.adapter:
        config = replace(config, peft=PeftConfig(kind="lora", r=4, alpha=8.0))
    if signal_hook:
        config = replace(
            config, pipeline=PipelineConfig(preprocessors=[ComponentSpec("tests.train.resume_hooks:SignalAt")])
        )
    if parallel:
        from ditty.config.sections import ParallelConfig

        config = replace(config, parallel=ParallelConfig(kind=parallel))
    return config


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def losses(run_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in records(run_dir) if "loss" in r]
