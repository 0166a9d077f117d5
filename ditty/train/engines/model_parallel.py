"""`ModelParallelEngine`: FSDP2 composed with tensor and context parallel on one ("dp", "cp", "tp") mesh.

`parallel.kind = "fsdp"` with `parallel.tp` or `parallel.cp` above 1. Wrapping, in torchtitan's
order: the tensor-parallel plan on the "tp" dimension (ditty.parallel.tensor), the Ulysses attention
for the "cp" dimension (ditty.models.ulysses), then FSDP2 per block over the flattened "dp_cp"
dimension (skipped when that is one rank: tp x cp = the world). A model built on the meta device gets
its weights after that, each rank its 2-D shard of every tensor. Every micro-batch runs with the
loss's vocabulary-parallel handlers on (forward and backward, ditty.stages.vocab_parallel) and, under
context parallel, with the Ulysses all-to-all over the "cp" ranks.

Everything else is FSDP2's: checkpoints through DCP (DTensors of any mesh, resharded on load to any
other), `final/` gathered tensor by tensor, gradient sync on the last micro-batch.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

from torch import nn

from ditty.train.engines.fsdp import FSDPEngine


class ModelParallelEngine(FSDPEngine):
    def wrap(self, model: nn.Module, pending: Any = None) -> nn.Module:
        from ditty.parallel.mesh import sub_mesh
        from ditty.parallel.tensor import apply_tensor_parallel, check_tensor_parallel_model
        from ditty.parallel.wrap import shard_fsdp

        mesh = self.runtime.mesh
        tp_mesh = sub_mesh(mesh, "tp")
        check_tensor_parallel_model(model)
        if tp_mesh is not None:
            apply_tensor_parallel(model, tp_mesh)
        if sub_mesh(mesh, "cp") is not None:
            from ditty.models.ulysses import use_ulysses_attention
            from ditty.parallel.tensor import sequence_score_head

            use_ulysses_attention(model)
            score = sequence_score_head(model)
            if score is not None:  # a reward model reads each row at its last token, on whichever piece
                from ditty.objectives.context_rows import read_scores_at_whole_rows

                read_scores_at_whole_rows(model, score)
        data = self.runtime.batch_mesh
        if data.size() > 1:
            model = shard_fsdp(model, self.config.parallel, data, precision=self.config.train.precision)
        if pending is not None:
            from ditty.parallel.materialize import load_sharded_from_safetensors

            model = load_sharded_from_safetensors(model, pending.source_dir, device=self.runtime.device)
        return model

    def micro_batch(self, model: nn.Module, index: int, count: int) -> ContextManager:
        from ditty.parallel.mesh import sub_mesh
        from ditty.stages.vocab_parallel import vocab_parallel

        stack = contextlib.ExitStack()
        stack.enter_context(super().micro_batch(model, index, count))  # FSDP2's gradient sync, when it wraps
        stack.enter_context(vocab_parallel())
        cp_mesh = sub_mesh(self.runtime.mesh, "cp")
        if cp_mesh is not None:
            from ditty.models.ulysses import context_parallel

            stack.enter_context(context_parallel(cp_mesh))
        return stack
