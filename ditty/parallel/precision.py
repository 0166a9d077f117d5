"""The compute-precision policy of `train.precision`: autocast and, for fp16, dynamic loss scaling.

`model.dtype` (how weights are stored) is the model builder's business; this module only decides
how the forward computes and how the backward is scaled. Not done here: bf16 weights with an fp32
master copy for the optimizer (that needs a master-weights optimizer wrapper); with
`model.dtype = "bfloat16"` the optimizer state follows the parameters and is bf16 too.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Precision:
    """Autocast context, loss scaling and the matching unscale/step for one device type."""

    kind: str
    device_type: str
    compute_dtype: Optional[torch.dtype]
    scaler: Optional[torch.amp.GradScaler] = None

    def autocast(self):
        """The forward's context: autocast to the compute dtype, or nothing for fp32."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.compute_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to true scale before clipping or measuring their norm."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step the optimizer; with fp16 the scaler skips steps with inf/NaN gradients itself.

        Returns True when the optimizer really stepped. Cost: with a scaler, one host sync to read
        the found-inf flag (GradScaler does one anyway inside `step`).
        """
        if self.scaler is None:
            optimizer.step()
            return True
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # The scale only falls when an overflow made the scaler skip the step.
        return self.scaler.get_scale() >= scale_before

    @property
    def loss_scale(self) -> Optional[float]:
        return self.scaler.get_scale() if self.scaler is not None else None

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])


def build_precision(kind: str, device: torch.device) -> Precision:
    """fp32: plain; bf16: autocast (no scaling needed: bf16 has fp32's range); fp16: autocast + GradScaler."""
    if kind not in _DTYPES:
        raise ValueError(f"unknown precision {kind!r}")
    device_type = device.type
    scaler = torch.amp.GradScaler(device_type) if kind == "fp16" else None
    return Precision(kind=kind, device_type=device_type, compute_dtype=_DTYPES[kind], scaler=scaler)
