"""`FSDPEngine`: FSDP2 (`fully_shard`) per block then the root, on a 1-D (fsdp) or 2-D (hsdp) mesh.

Every parameter becomes a DTensor shard, so the optimizer (built after `wrap`) holds only this
rank's slice of every state tensor. A model built on the meta device (ditty.models.meta) gets its
weights right after sharding: rank 0 reads or sends them tensor by tensor, each rank keeps its slice.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from ditty.train.engines.ddp import DataParallelEngine


class FSDPEngine(DataParallelEngine):
    def wrap(self, model: nn.Module, pending: Any = None) -> nn.Module:
        rank0_tensors = None
        if pending is not None and pending.quantized and dist.get_rank() == 0:
            from ditty.parallel.materialize import full_tensor_references

            # Rank 0's full (quantized) tensors, adapters included, kept alive until they are sent.
            rank0_tensors = full_tensor_references(model)
        model = super().wrap(model)
        if pending is not None:
            model = self._load_pending(model, pending, rank0_tensors)
        return model

    def _load_pending(self, model: nn.Module, pending: Any, rank0_tensors: Optional[dict]) -> nn.Module:
        from ditty.parallel.materialize import load_sharded_from_rank0_tensors, load_sharded_from_safetensors

        device = self.runtime.device
        if not pending.quantized:
            return load_sharded_from_safetensors(model, pending.source_dir, device=device)
        from ditty.models.quant import share_4bit_quant_states

        load_sharded_from_rank0_tensors(model, rank0_tensors, device=device)
        share_4bit_quant_states(model, device)
        return model

    def full_state_dict(self, model: nn.Module) -> Optional[dict[str, torch.Tensor]]:
        """Gathered shard by shard on every rank and kept on rank 0 only, each tensor moved to the CPU as
        it arrives (`cpu_offload`), so no accelerator holds the whole model; the host holds one full
        copy on rank 0, the size of the `final/` it is about to write."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() != 0:
            return None
        return _one_tensor_per_parameter(model, state)


def _one_tensor_per_parameter(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with the names of one parameter (a head tied to its embedding) pointing at one tensor, as
    in an unsharded model's state dict: each name was gathered into a copy of its own, and
    `save_pretrained` drops a tied name only when it shares storage with the other (else final/ would
    hold the tied weight twice)."""
    from ditty.parallel.materialize import clean_name

    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(clean_name(name))
    for aliases in names.values():
        present = [name for name in aliases if name in state]
        for alias in present[1:]:
            state[alias] = state[present[0]]
    return state
