"""`MuonWithAdamW`: torch.optim.Muon on the hidden 2-D weights and torch.optim.AdamW on the rest,
as one optimizer (imports torch: load it only to build one). The Muon part iterates Newton-Schulz
in the dtype that is fast on the device (ditty.optim.newton_schulz).

One object, so everything that takes "the optimizer" works unchanged: one `state_dict` (DCP names
its state by parameter), one learning-rate schedule over all groups, one `zero_grad`, step hooks.
The two torch optimizers inside do the arithmetic; they hold this optimizer's own group dicts and
state, so what they compute is exactly what torch.optim.Muon / AdamW compute.

Under FSDP2 a parameter is a shard of its matrix, and Newton-Schulz needs the whole matrix: a
sharded orthogonalisation would be wrong. The recipe compiler refuses muon with FSDP/HSDP, and
`step` refuses a DTensor parameter, so such a run never computes on shards.
"""

from __future__ import annotations

from typing import Any

import torch

from ditty.config.errors import RecipeError
from ditty.optim.newton_schulz import Muon


class MuonWithAdamW(torch.optim.Optimizer):
    """Param groups carry "algorithm": "muon" (torch.optim.Muon's keys) or "adamw" (AdamW's); `muon`
    may name the Newton-Schulz dtype as "ns_dtype" (default bfloat16, torch's)."""

    def __init__(self, groups: list[dict[str, Any]], *, muon: dict[str, Any], adamw: dict[str, Any]) -> None:
        options = {"muon": muon, "adamw": adamw}
        classes = {"muon": Muon, "adamw": torch.optim.AdamW}
        self._parts: dict[str, torch.optim.Optimizer] = {}
        for algorithm in ("muon", "adamw"):
            own = [group for group in groups if group["algorithm"] == algorithm]
            if own:  # torch's constructors fill each group dict with their defaults, in place
                self._parts[algorithm] = classes[algorithm](own, **options[algorithm])
        super().__init__(groups, {})
        self._link()
        for group in self.param_groups:
            if group["algorithm"] == "muon" and any(_is_dtensor(p) for p in group["params"]):
                raise RecipeError.single(
                    "Muon cannot update FSDP2-sharded parameters: Newton-Schulz needs each whole matrix",
                    key="optimizer.kind",
                    fix='use parallel.kind = "ddp" (or one process) with muon, or optimizer.kind = "adamw" with FSDP',
                )

    def _link(self) -> None:
        """Point the inner optimizers at this one's groups and state (after a load replaced them)."""
        for algorithm, part in self._parts.items():
            part.param_groups = [group for group in self.param_groups if group["algorithm"] == algorithm]
            part.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self._parts.values():
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._link()


def _is_dtensor(tensor: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return False
    return isinstance(tensor, DTensor)
