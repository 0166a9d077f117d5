"""Engines: how the model trains on the world it runs in, one class per `parallel.kind`.

| kind         | class             | wraps the model                    | checkpoint tensors written by |
|--------------|-------------------|------------------------------------|-------------------------------|
| one process  | `Engine`          | not at all                         | ditty (DCP)                   |
| "ddp"        | `DDPEngine`       | DistributedDataParallel            | ditty (DCP)                   |
| "fsdp"/"hsdp"| `FSDPEngine`      | FSDP2 `fully_shard` per block      | ditty (DCP, resharded on load)|
| "deepspeed"  | `DeepSpeedEngine` | a DeepSpeed ZeRO engine            | DeepSpeed                     |
| "fsdp" with tp or cp | `ModelParallelEngine` | tensor parallel, Ulysses, FSDP2 | ditty (DCP, resharded on load)|

Adding a parallel kind: subclass `Engine` (override what differs), register it in `ENGINES`, add the
kind to `ParallelConfig.kind` and its compiler rules. The trainer needs no change.
"""

from __future__ import annotations

from typing import Any

from ditty.train.engines.base import Engine
from ditty.train.engines.ddp import DDPEngine
from ditty.train.engines.deepspeed import DeepSpeedEngine
from ditty.train.engines.fsdp import FSDPEngine
from ditty.train.engines.model_parallel import ModelParallelEngine

ENGINES: dict[str, type[Engine]] = {
    "none": Engine,
    "ddp": DDPEngine,
    "fsdp": FSDPEngine,
    "hsdp": FSDPEngine,
    "deepspeed": DeepSpeedEngine,
}


def engine_class(kind: str, world_size: int, *, model_parallel: bool = False) -> type[Engine]:
    """The engine of `parallel.kind` on `world_size` processes. ddp/fsdp/hsdp on one process have
    nothing to wrap and train as one process; DeepSpeed starts a one-rank group and wraps anyway.
    `model_parallel`: tp or cp above 1 (the compiler allows them with "fsdp" only)."""
    if world_size == 1 and kind != "deepspeed":
        return Engine
    if model_parallel:
        return ModelParallelEngine
    return ENGINES[kind]


def build_engine(config: Any, runtime: Any) -> Engine:
    parallel = config.parallel
    model_parallel = parallel.tp > 1 or parallel.cp > 1
    return engine_class(parallel.kind, runtime.world_size, model_parallel=model_parallel)(config, runtime)


__all__ = [
    "DDPEngine",
    "DeepSpeedEngine",
    "ENGINES",
    "Engine",
    "FSDPEngine",
    "ModelParallelEngine",
    "build_engine",
    "engine_class",
]
