"""`DDPEngine`: DistributedDataParallel on several processes (whole model on every rank)."""

from __future__ import annotations

from typing import Any, ContextManager

from torch import nn

from ditty.train.engines.base import Engine


class DataParallelEngine(Engine):
    """What DDP and FSDP2 share: wrapped by `ditty.parallel.apply_parallelism` on the run's mesh, and
    gradients reduced across ranks on the last micro-batch of a step only."""

    def wrap(self, model: nn.Module, pending: Any = None) -> nn.Module:
        from ditty.parallel import apply_parallelism

        return apply_parallelism(model, self.config.parallel, self.runtime.mesh, precision=self.config.train.precision)

    def micro_batch(self, model: nn.Module, index: int, count: int) -> ContextManager:
        # Reducing on every micro-batch instead (`parallel.sync_grad_accum`) costs a collective per
        # micro-batch and saves the memory of one unsharded gradient per block under FSDP.
        from ditty.parallel import no_sync_context

        return no_sync_context(model, index == count - 1, self.config.parallel.sync_grad_accum)


class DDPEngine(DataParallelEngine):
    """ddp: DistributedDataParallel; checkpoints through DCP like one process."""
