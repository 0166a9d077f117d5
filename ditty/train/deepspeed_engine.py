"""The trainer's side of DeepSpeed ZeRO-2/3 (`parallel.kind = "deepspeed"`).

DeepSpeed wraps the model and ditty's torch optimizer in its engine and then owns, per its design:
gradient reduction and partitioning, accumulation (the optimizer steps inside `engine.step()` at the
last micro-batch), clipping (`gradient_clipping`), fp16 loss scaling, and its checkpoint format.
ditty keeps everything else: data order and global batch, the per-token loss normalisation, the LR
schedule (a torch scheduler on the optimizer whose param groups the engine keeps), logging,
evaluation, `final/`, and its checkpoint directory layout (`checkpoints/step-N` with the sidecar and
`COMPLETE`, the engine's files inside under `deepspeed/`).

Two adjustments make the math the same as ditty's other engines (parity tests in
tests/train/test_deepspeed_run.py):
- `engine.backward(loss, scale_wrt_gas=False)`: ditty's loss is already each micro-batch's share of
  the global per-token mean, so DeepSpeed must not divide it by the accumulation steps again;
- the engine averages gradients over ranks like DDP does, which `LossNormaliser` already undoes.

The config dict comes from `ditty.parallel.deepspeed.deepspeed_config` (pure, tested alone).
"""

from __future__ import annotations

import os
import socket
from typing import Any, Optional

import torch
from torch import nn

ENGINE_DIR = "deepspeed"  # inside checkpoints/step-N
ENGINE_TAG = "state"


def select_accelerator(device: torch.device) -> None:
    """DeepSpeed picks its accelerator at import; on a CPU run it must be the CPU one.

    A user's DS_ACCELERATOR wins. Without it DeepSpeed would probe for CUDA and, on a GPU machine
    running a CPU recipe, put the engine on the GPU.
    """
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def ensure_process_group(device: torch.device) -> None:
    """DeepSpeed needs torch.distributed even on one process (ZeRO-3 with CPU offload on one GPU is
    a common use): start a one-rank group when torchrun did not start one."""
    import torch.distributed as dist

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


def initialize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Any,
    *,
    accumulation_steps: int,
    world_size: int,
    device: torch.device,
):
    """Wrap `model` and `optimizer` in a DeepSpeed engine; returns (engine, engine's optimizer)."""
    from ditty.parallel.deepspeed import deepspeed_config, require_deepspeed

    select_accelerator(device)
    deepspeed = require_deepspeed()
    ensure_process_group(device)
    ds_config = deepspeed_config(
        config.parallel,
        micro_batch_size=config.train.micro_batch_size,
        accumulation_steps=accumulation_steps,
        world_size=world_size,
        precision=config.train.precision,
        max_grad_norm=config.train.max_grad_norm,
        pin_memory=device.type == "cuda",
    )
    engine, engine_optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=ds_config, dist_init_required=False
    )
    return engine, engine_optimizer


def is_engine(model: Any) -> bool:
    return type(model).__name__ == "DeepSpeedEngine" and type(model).__module__.startswith("deepspeed")


def backward(engine: Any, loss: torch.Tensor) -> None:
    """One micro-batch: backward without DeepSpeed's division by the accumulation steps, then
    `engine.step()`, which only counts micro-batches until the last one and then steps the optimizer."""
    engine.backward(loss, scale_wrt_gas=False)
    engine.step()


def step_figures(engine: Any, skipped_before: int) -> tuple[float, bool]:
    """(gradient norm before clipping, whether DeepSpeed skipped the step: an fp16 overflow)."""
    norm = engine.get_global_grad_norm()
    norm = float(norm) if norm is not None else float("nan")
    return norm, engine.skipped_steps > skipped_before


# ---------------------------------------------------------------------------- final weights


def full_state_dict(engine: Any) -> Optional[dict[str, torch.Tensor]]:
    """ZeRO-3: the module's full state dict on rank 0 (CPU), None elsewhere; every rank must call it.
    Each parameter is gathered on its own, so no rank ever holds the whole model at once.
    ZeRO-2 keeps whole parameters in the module on every rank: None (rank 0 saves its module as is).
    """
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


# ---------------------------------------------------------------------------- checkpoints


def save_engine(engine: Any, checkpoint_dir: str) -> None:
    """Every rank writes its partition of the model and optimizer state with DeepSpeed's own API."""
    engine.save_checkpoint(os.path.join(checkpoint_dir, ENGINE_DIR), tag=ENGINE_TAG, save_latest=False)


def check_engine_state(checkpoint_dir: Any, kind: str, saved_world_size: Optional[int]) -> None:
    """A checkpoint resumes only with the engine that wrote it: DeepSpeed's files (cut for the world
    size that wrote them) with parallel.kind = "deepspeed" on that world size, DCP shards otherwise.
    Checked when the resume is planned, before anything is built or written."""
    from ditty._utils.dist import world_size
    from ditty.config.errors import RecipeError

    has_engine_state = os.path.isdir(os.path.join(str(checkpoint_dir), ENGINE_DIR))
    if has_engine_state != (kind == "deepspeed"):
        raise RecipeError.single(
            f"checkpoint {checkpoint_dir} was written by {'DeepSpeed' if has_engine_state else 'a non-DeepSpeed run'}; "
            f"this run has parallel.kind = {kind!r}",
            key="parallel.kind",
            fix="resume with the parallel.kind that wrote the checkpoint, or start a new run",
        )
    current = world_size()
    if has_engine_state and saved_world_size is not None and saved_world_size != current:
        raise RecipeError.single(
            f"checkpoint {checkpoint_dir} was written by {saved_world_size} DeepSpeed processes, this run has "
            f"{current}; DeepSpeed's checkpoint files are partitioned per process",
            key="checkpoint.resume",
            fix=f"resume with {saved_world_size} processes in all, or start a new run",
        )


def load_engine(engine: Any, checkpoint_dir: str) -> None:
    """Restore the model and optimizer partitions this rank wrote (same world size: `check_engine_state`)."""
    from ditty.config.errors import RecipeError

    path = os.path.join(checkpoint_dir, ENGINE_DIR)
    if not os.path.isdir(os.path.join(path, ENGINE_TAG)):
        raise RecipeError.single(
            f"checkpoint {checkpoint_dir} holds no DeepSpeed state (was it written by another parallel.kind?)",
            key="checkpoint.resume",
            fix="resume with the parallel.kind that wrote it, or start a new run",
        )
    loaded, _ = engine.load_checkpoint(path, tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=False)
    if loaded is None:
        raise RecipeError.single(
            f"DeepSpeed could not load {path}",
            key="checkpoint.resume",
            fix="resume from another checkpoint, or start a new run",
        )


# ---------------------------------------------------------------------------- the step's figures


def finish_step(trainer: Any, loss: torch.Tensor, tokens: torch.Tensor, supervised: torch.Tensor, metrics: dict):
    """The StepOutput of a step the engine has already taken (at the last micro-batch's `engine.step()`).

    DeepSpeed skips fp16-overflow steps itself (reported as skipped, like ditty's own engines). A
    non-finite loss or gradient norm it did not skip has already reached the weights, so the run stops
    at once instead of counting it against `train.max_skipped_steps`.
    """
    import math
    import warnings

    from ditty.train.state import NonFiniteLossError
    from ditty.train.step import StepOutput

    engine = trainer.engine
    skipped_before = trainer._deepspeed_skipped
    norm_value, skipped = step_figures(engine, skipped_before)
    trainer._deepspeed_skipped = engine.skipped_steps
    values = torch.stack([t.to(trainer.device, torch.float64) for t in (loss, tokens, supervised)])
    loss_value, tokens_value, supervised_value = values.tolist()
    if not skipped and not (math.isfinite(loss_value) and math.isfinite(norm_value)):
        raise NonFiniteLossError(
            f"stopping: step {trainer.state.step + 1} had a non-finite "
            f"{'loss' if not math.isfinite(loss_value) else 'gradient'} "
            f'and DeepSpeed applied it. Try a lower optimizer.lr, train.max_grad_norm, or train.precision = "fp32". '
            f"Files already in {trainer.config.run.output_dir} are kept; no final model was written."
        )
    lr = trainer.optimizer.param_groups[0]["lr"]
    with warnings.catch_warnings():  # torch warns when the scheduler steps before any optimizer step
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
        trainer.scheduler.step()
    reason = "fp16 overflow (DeepSpeed lowered the loss scale)" if skipped else ""
    return StepOutput(
        loss_value, norm_value, int(tokens_value), int(supervised_value), skipped, reason, metrics | {"lr": lr}
    )


def memory_figures(engine: Any) -> tuple[int, int]:
    """(parameter bytes, optimizer-state bytes) this rank holds. ZeRO-3 keeps a parameter's partition
    in `ds_tensor` (the module's tensor is empty); the state is the wrapped torch optimizer's, which
    ZeRO keeps on flat partitions of the parameters."""
    from ditty.parallel.memory import local_nbytes, optimizer_state_bytes

    params = sum(local_nbytes(getattr(p, "ds_tensor", p)) for p in engine.module.parameters())
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    return params, optimizer_state_bytes(base)


def load_weights_for_export(model: nn.Module, checkpoint_dir: str, *, strict: bool = True) -> None:
    """`ditty export` of a DeepSpeed run: rebuild the full fp32 weights from every rank's partitions
    with DeepSpeed's own `zero_to_fp32` reader (on one process, no engine) and load them into `model`."""
    from ditty.config.errors import RecipeError
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
    missing = [k for k in missing if strict or "lora_" in k]  # an adapter run saves the frozen base too
    if missing or unexpected:
        raise RecipeError.single(
            f"checkpoint {checkpoint_dir} does not fit the recipe's model (missing "
            f"{missing[:3]}, unexpected {unexpected[:3]})",
            key="checkpoint.resume",
            fix="export with the recipe the run was trained with",
        )
