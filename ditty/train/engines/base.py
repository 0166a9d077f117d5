"""`Engine`: how the model trains on the world it runs in. This base class is the one-process engine;
each parallel kind overrides what it does differently (ddp.py, fsdp.py, deepspeed.py).

The trainer's outline calls these methods for everything that depends on `parallel.kind`: wrapping
the model, attaching the optimizer, the per-micro-batch gradient sync, backward, the optimizer step
(clipping, skipping a non-finite step), the full weights for `final/`, what a checkpoint holds, and
the memory figures. A new engine (tensor parallel, say) is one subclass registered in
`ditty.train.engines.ENGINES`.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

import torch
from torch import nn

from ditty.train.step import StepOutput, clip_grads, grad_norm


class Engine:
    """One process: the model as built, the optimizer as built, ditty's own step and DCP checkpoints."""

    writes_own_checkpoint = False
    """True when the engine writes model and optimizer state itself (DeepSpeed); else ditty's DCP does."""
    async_save = True
    """Whether checkpoints may be written in the background (`checkpoint.async_save`)."""

    def __init__(self, config: Any, runtime: Any) -> None:
        self.config = config
        self.runtime = runtime

    # ---------------------------------------------------------------- building

    def wrap(self, model: nn.Module, pending: Any = None) -> nn.Module:
        """The model ready for the optimizer (after converters and speedups). `pending`: weights of a
        meta-built model (ditty.models.meta), which only sharding engines receive."""
        return model

    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        """(model, optimizer) the loop drives; an engine that wraps both returns its own."""
        return model, optimizer

    def adapt_precision(self, precision: Any) -> Any:
        """The compute-precision policy as this engine needs it (DeepSpeed scales fp16 itself)."""
        return precision

    # ---------------------------------------------------------------- one step

    def micro_batch(self, model: nn.Module, index: int, count: int) -> ContextManager:
        """Context for one micro-batch's forward and backward (gradient sync happens on the last)."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, precision: Any) -> None:
        precision.backward(loss)

    def step(self, model: nn.Module, optimizer: Any, precision: Any, totals: torch.Tensor) -> StepOutput:
        """Clip and step, unless the loss or the gradient norm is not finite: then skip. Gradients are
        zeroed either way. `totals` is [loss, input tokens, supervised tokens] of the step, summed over
        ranks (float64, on the device).

        Cost: one host sync per step (loss, norm and counts read together) to decide whether to step.
        """
        params = [p for p in model.parameters() if p.requires_grad]
        precision.unscale_(optimizer)
        norm = grad_norm(params)  # a DTensor under FSDP: clipping takes it as is, the log reads its full value
        values = torch.cat(
            [totals.to(torch.float64), self.local_value(norm).reshape(1).to(totals.device, torch.float64)]
        )
        loss, tokens, supervised, norm_value = values.tolist()
        skipped, reason = False, ""
        if not math.isfinite(loss) or not math.isfinite(norm_value):
            skipped, reason = True, "non-finite loss" if not math.isfinite(loss) else "non-finite gradient"
            if precision.scaler is not None:
                precision.scaler.update()  # unscale_ was called: the scaler must close this step
        else:
            clip_grads(params, self.config.train.max_grad_norm, norm)
            if not precision.step(optimizer):
                skipped, reason = True, "fp16 overflow (loss scale lowered)"
        optimizer.zero_grad(set_to_none=True)
        return StepOutput(loss, norm_value, int(tokens), int(supervised), skipped, reason)

    @staticmethod
    def local_value(norm: torch.Tensor) -> torch.Tensor:
        """A plain tensor of the gradient norm (a sharded norm is a DTensor: one collective to read it)."""
        from torch.distributed.tensor import DTensor

        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    # ---------------------------------------------------------------- the model

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module without this engine's (and compile's) wrappers."""
        from ditty._utils.modules import unwrap

        return unwrap(model)

    def full_state_dict(self, model: nn.Module) -> Optional[dict[str, torch.Tensor]]:
        """The whole model's weights on rank 0 for `final/`, or None when rank 0's own module already
        holds them (every rank must call it: a sharded engine gathers)."""
        return None

    def memory_figures(self, model: nn.Module, optimizer: Any) -> tuple[int, int]:
        """(parameter bytes, optimizer-state bytes) in this rank's local tensors."""
        from ditty.parallel.memory import optimizer_state_bytes, parameter_bytes

        return parameter_bytes(model), optimizer_state_bytes(optimizer)

    # ---------------------------------------------------------------- checkpoints

    def checkpoint_state(self, model: nn.Module, optimizer: Any, *, trainable_only: bool) -> dict[str, Any]:
        """What ditty's DCP writes: model and optimizer (resharded on load to any world size)."""
        from ditty.checkpoint import ModelOptimizerState

        # keep_hyperparameters: a resumed run trains with the recipe's lr, betas, eps (not the saved ones)
        return {
            "train": ModelOptimizerState(model, optimizer, trainable_only=trainable_only, keep_hyperparameters=True)
        }

    def checkpoint_writer(self, model: nn.Module) -> Optional[Callable[[Path], None]]:
        """Files the engine writes itself into a checkpoint being saved (collective), or None."""
        return None

    def load_checkpoint_files(self, model: nn.Module, checkpoint_dir: Path) -> None:
        """Restore what `checkpoint_writer` wrote (after ditty's own state has loaded)."""

    @classmethod
    def check_resumable(cls, checkpoint_dir: Path, saved_world_size: Optional[int], world_size: int) -> None:
        """Refuse, before anything is built, a checkpoint this engine cannot resume (a RecipeError)."""
        from ditty.config.errors import RecipeError
        from ditty.train.engines.deepspeed import ENGINE_DIR

        if (Path(checkpoint_dir) / ENGINE_DIR).is_dir():
            raise RecipeError.single(
                f'checkpoint {checkpoint_dir} was written by DeepSpeed; this run\'s parallel.kind is not "deepspeed"',
                key="parallel.kind",
                fix="resume with the parallel.kind that wrote the checkpoint, or start a new run",
            )

    @classmethod
    def load_for_export(cls, model: nn.Module, checkpoint_dir: Path, *, adapter: bool) -> None:
        """Load a checkpoint's model weights into `model` on one process (`ditty export`)."""
        from ditty.checkpoint import ModelOptimizerState, load_checkpoint

        load_checkpoint(checkpoint_dir, {"train": ModelOptimizerState(model, None, trainable_only=adapter)})
