"""`DeepSpeedEngine`: DeepSpeed ZeRO-2/3 (`parallel.kind = "deepspeed"`).

DeepSpeed wraps the model and ditty's torch optimizer in its engine and then owns, per its design:
gradient reduction and partitioning, accumulation (the optimizer steps inside `engine.step()` at the
last micro-batch), clipping (`gradient_clipping`), fp16 loss scaling, and its checkpoint format.
ditty keeps everything else: data order and global batch, the per-token loss normalisation, the LR
schedule (a torch scheduler on the optimizer whose param groups the engine keeps), logging,
evaluation, `final/`, and its checkpoint directory layout (`checkpoints/step-N` with the sidecar and
`COMPLETE`, the engine's files inside under `deepspeed/`).

Two adjustments make the math the same as ditty's other engines:
- `engine.backward(loss, scale_wrt_gas=False)`: ditty's loss is already each micro-batch's share of
  the global per-token mean, so DeepSpeed must not divide it by the accumulation steps again;
- the engine averages gradients over ranks like DDP does, which `LossNormaliser` already undoes.

The config dict comes from `ditty.parallel.deepspeed.deepspeed_config` (pure, tested alone).
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from ditty.config.errors import RecipeError
from ditty.train.engines.base import Engine
from ditty.train.state import NonFiniteLossError
from ditty.train.step import StepOutput

ENGINE_DIR = "deepspeed"  # inside checkpoints/step-N
ENGINE_TAG = "state"


class DeepSpeedEngine(Engine):
    writes_own_checkpoint = True
    async_save = False  # DeepSpeed's save_checkpoint is synchronous

    def __init__(self, config: Any, runtime: Any) -> None:
        super().__init__(config, runtime)
        self.engine: Any = None
        self.skipped_before = 0
        """DeepSpeed's count of skipped (fp16-overflow) steps after the last step ditty read."""

    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        """The engine stands for both from here: the model is the engine, the optimizer its ZeRO
        optimizer, whose param groups are the torch optimizer's (so the LR scheduler built on that one
        still drives it)."""
        from ditty.parallel.deepspeed import deepspeed_config, require_deepspeed

        device = self.runtime.device
        select_accelerator(device)
        deepspeed = require_deepspeed()
        if device.type == "cpu":
            skip_shared_memory_op()
        ensure_process_group(device)
        train = self.config.train
        ds_config = deepspeed_config(
            self.config.parallel,
            micro_batch_size=train.micro_batch_size,
            accumulation_steps=train.accumulation_steps(self.runtime.world_size),
            world_size=self.runtime.world_size,
            precision=train.precision,
            max_grad_norm=train.max_grad_norm,
            pin_memory=device.type == "cuda",
        )
        self.engine, engine_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=ds_config, dist_init_required=False
        )
        self.skipped_before = self.engine.skipped_steps
        return self.engine, engine_optimizer

    def adapt_precision(self, precision: Any) -> Any:
        precision.scaler = None  # the engine scales fp16 losses itself ("fp16": {"loss_scale": 0})
        return precision

    # ---------------------------------------------------------------- one step

    def backward(self, loss: torch.Tensor, precision: Any) -> None:
        """Backward without DeepSpeed's division by the accumulation steps, then `engine.step()`,
        which only counts micro-batches until the last one and then steps the optimizer."""
        self.engine.backward(loss, scale_wrt_gas=False)
        self.engine.step()

    def step(self, model: nn.Module, optimizer: Any, precision: Any, totals: torch.Tensor) -> StepOutput:
        """The figures of a step the engine has already taken (at the last micro-batch's `engine.step()`).

        DeepSpeed skips fp16-overflow steps itself (reported as skipped, like ditty's own engines). A
        non-finite loss or gradient norm it did not skip has already reached the weights, so the run
        stops at once instead of counting it against `train.max_skipped_steps`.
        """
        norm = self.engine.get_global_grad_norm()
        norm_value = float(norm) if norm is not None else float("nan")
        skipped = self.engine.skipped_steps > self.skipped_before
        self.skipped_before = self.engine.skipped_steps
        loss, tokens, supervised = totals.to(torch.float64).tolist()
        if not skipped and not (math.isfinite(loss) and math.isfinite(norm_value)):
            raise NonFiniteLossError(
                f"stopping: the step had a non-finite {'loss' if not math.isfinite(loss) else 'gradient'} and "
                'DeepSpeed applied it. Try a lower optimizer.lr, train.max_grad_norm, or train.precision = "fp32". '
                f"Files already in {self.config.run.output_dir} are kept; no final model was written."
            )
        reason = "fp16 overflow (DeepSpeed lowered the loss scale)" if skipped else ""
        return StepOutput(loss, norm_value, int(tokens), int(supervised), skipped, reason)

    # ---------------------------------------------------------------- the model

    def full_state_dict(self, model: nn.Module) -> Optional[dict[str, torch.Tensor]]:
        """ZeRO-3: gathered parameter by parameter (no rank holds the whole model at once), kept on
        rank 0; ZeRO-2 keeps whole parameters in the module on every rank: None."""
        engine = self.engine
        if engine.zero_optimization_stage() < 3:
            return None
        import deepspeed
        import torch.distributed as dist

        module = engine.module
        rank = dist.get_rank() if dist.is_initialized() else 0
        params = dict(module.named_parameters(remove_duplicate=False))
        state: dict[str, torch.Tensor] = {}
        for name, value in module.state_dict().items():  # its keys: parameters and persistent buffers
            if name in params:
                with deepspeed.zero.GatheredParameters([params[name]], modifier_rank=None):
                    if rank == 0:
                        state[name] = params[name].detach().cpu().clone()
            elif rank == 0:
                state[name] = value.detach().cpu().clone()
        return state if rank == 0 else None

    def memory_figures(self, model: nn.Module, optimizer: Any) -> tuple[int, int]:
        """ZeRO-3 keeps a parameter's partition in `ds_tensor` (the module's tensor is empty); the state
        is the wrapped torch optimizer's, which ZeRO keeps on flat partitions of the parameters."""
        from ditty.parallel.memory import local_nbytes, optimizer_state_bytes

        params = sum(local_nbytes(getattr(p, "ds_tensor", p)) for p in self.engine.module.parameters())
        base = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)
        return params, optimizer_state_bytes(base)

    # ---------------------------------------------------------------- checkpoints

    def checkpoint_state(self, model: nn.Module, optimizer: Any, *, trainable_only: bool) -> dict[str, Any]:
        return {}  # the engine's own files hold model and optimizer (checkpoint_writer)

    def checkpoint_writer(self, model: nn.Module) -> Optional[Callable[[Path], None]]:
        """Every rank writes its partition of the model and optimizer state with DeepSpeed's own API."""
        return lambda directory: self.engine.save_checkpoint(
            os.path.join(directory, ENGINE_DIR), tag=ENGINE_TAG, save_latest=False
        )

    def load_checkpoint_files(self, model: nn.Module, checkpoint_dir: Path) -> None:
        """Restore the model and optimizer partitions this rank wrote (same world size: checked when
        the resume was planned)."""
        path = os.path.join(checkpoint_dir, ENGINE_DIR)
        if not os.path.isdir(os.path.join(path, ENGINE_TAG)):
            raise RecipeError.single(
                f"checkpoint {checkpoint_dir} holds no DeepSpeed state (was it written by another parallel.kind?)",
                key="checkpoint.resume",
                fix="resume with the parallel.kind that wrote it, or start a new run",
            )
        loaded, _ = self.engine.load_checkpoint(
            path, tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if loaded is None:
            raise RecipeError.single(
                f"DeepSpeed could not load {path}",
                key="checkpoint.resume",
                fix="resume from another checkpoint, or start a new run",
            )
        self.skipped_before = self.engine.skipped_steps  # restored by the engine: skips count from here

    @classmethod
    def check_resumable(cls, checkpoint_dir: Path, saved_world_size: Optional[int], world_size: int) -> None:
        """DeepSpeed's files are cut for the world size that wrote them, and only DeepSpeed reads them."""
        if not (Path(checkpoint_dir) / ENGINE_DIR).is_dir():
            raise RecipeError.single(
                f"checkpoint {checkpoint_dir} was written by a non-DeepSpeed run; this run has "
                'parallel.kind = "deepspeed"',
                key="parallel.kind",
                fix="resume with the parallel.kind that wrote the checkpoint, or start a new run",
            )
        if saved_world_size is not None and saved_world_size != world_size:
            raise RecipeError.single(
                f"checkpoint {checkpoint_dir} was written by {saved_world_size} DeepSpeed processes, this run has "
                f"{world_size}; DeepSpeed's checkpoint files are partitioned per process",
                key="checkpoint.resume",
                fix=f"resume with {saved_world_size} processes in all, or start a new run",
            )

    @classmethod
    def load_for_export(cls, model: nn.Module, checkpoint_dir: Path, *, adapter: bool) -> None:
        """The full fp32 weights rebuilt from every rank's partitions by DeepSpeed's own `zero_to_fp32`
        reader (one process, no engine). An adapter run saves the frozen base too: only the adapter's
        keys must be there."""
        from ditty.parallel.deepspeed import require_deepspeed

        select_accelerator(torch.device("cpu"))
        require_deepspeed()
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        path = os.path.join(checkpoint_dir, ENGINE_DIR)
        if not os.path.isdir(os.path.join(path, ENGINE_TAG)):
            raise RecipeError.single(
                f"checkpoint {checkpoint_dir} holds no DeepSpeed state",
                key="checkpoint.resume",
                fix="export a checkpoint of the run that wrote it",
            )
        state = get_fp32_state_dict_from_zero_checkpoint(path, tag=ENGINE_TAG)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not adapter or "lora_" in k]
        if missing or unexpected:
            raise RecipeError.single(
                f"checkpoint {checkpoint_dir} does not fit the recipe's model (missing "
                f"{missing[:3]}, unexpected {unexpected[:3]})",
                key="checkpoint.resume",
                fix="export with the recipe the run was trained with",
            )


def select_accelerator(device: torch.device) -> None:
    """DeepSpeed picks its accelerator at import; on a CPU run it must be the CPU one. A user's
    DS_ACCELERATOR wins; without it DeepSpeed would probe for CUDA and, on a GPU machine running a
    CPU recipe, put the engine on the GPU."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def skip_shared_memory_op() -> None:
    """Keep DeepSpeed's CPU backend from JIT-compiling its shared-memory all-reduce op: ditty's
    collectives go through gloo, which does not use it, and the build is a C++ compile under a lock
    file in the torch extensions cache (minutes on a small CPU; a build killed midway leaves the lock,
    and every later run waits on it forever)."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def ensure_process_group(device: torch.device) -> None:
    """DeepSpeed needs torch.distributed even on one process (ZeRO-3 with CPU offload on one GPU is
    a common use): start a one-rank group when torchrun did not start one."""
    import torch.distributed as dist

    from ditty.parallel.env import created_group

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(port)),
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
    ):
        os.environ.setdefault(key, value)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    created_group()
