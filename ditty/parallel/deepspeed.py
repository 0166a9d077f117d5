"""DeepSpeed ZeRO-2/3: the engine config built from `[parallel]`, and the import guard.

deepspeed is an optional extra (`pip install 'ditty[deepspeed]'`; it compiles ops on install), so
nothing here imports it at module level. `deepspeed_problems` and `deepspeed_config` are pure.

The trainer drives the engine through `ditty.train.engines.deepspeed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ditty.config.errors import Problem, RecipeError

if TYPE_CHECKING:  # pragma: no cover
    from ditty.config.sections import ParallelConfig

INSTALL_HINT = "pip install 'ditty[deepspeed]'"


def require_deepspeed() -> Any:
    """Import deepspeed, or raise the RecipeError that says how to install it."""
    try:
        import deepspeed
    except ImportError as error:
        raise RecipeError.single(
            f'parallel.kind = "deepspeed" needs the deepspeed package ({error})',
            key="parallel.kind",
            fix=f'{INSTALL_HINT}, or use parallel.kind = "fsdp"',
        ) from None
    return deepspeed


def deepspeed_problems(parallel: "ParallelConfig") -> list[Problem]:
    """Recipe problems of the DeepSpeed options alone (the compiler can call this without torch)."""
    if parallel.kind != "deepspeed":
        return []
    problems = []
    if parallel.zero_stage not in (2, 3):
        problems.append(Problem("parallel.zero_stage", f"must be 2 or 3, got {parallel.zero_stage}"))
    if parallel.offload_params and parallel.zero_stage != 3:
        problems.append(
            Problem(
                "parallel.offload_params",
                "offloads parameters, which only ZeRO stage 3 partitions",
                fix="set parallel.zero_stage = 3, or parallel.offload_params = false",
            )
        )
    return problems


def deepspeed_config(
    parallel: "ParallelConfig",
    *,
    micro_batch_size: int,
    accumulation_steps: int,
    world_size: int,
    precision: str = "fp32",
    max_grad_norm: float | None = None,
    pin_memory: bool = False,
) -> dict[str, Any]:
    """The engine config dict. `pin_memory` only on CUDA (pinning needs an accelerator)."""
    problems = deepspeed_problems(parallel)
    if problems:
        raise RecipeError(problems)
    zero: dict[str, Any] = {
        "stage": parallel.zero_stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
    }
    if parallel.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
    if parallel.zero_stage == 3:
        # Saving a consolidated model gathers the 16-bit weights on rank 0 (what `final/` needs).
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if parallel.offload_params:
            zero["offload_param"] = {"device": "cpu", "pin_memory": pin_memory}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": accumulation_steps,
        "train_batch_size": micro_batch_size * accumulation_steps * world_size,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": precision == "bf16"},
        # loss_scale 0: dynamic scaling, the only safe default for fp16.
        "fp16": {"enabled": precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "steps_per_print": 2**31 - 1,  # ditty logs; DeepSpeed's own step prints stay quiet
        "wall_clock_breakdown": False,
    }
    if parallel.offload_optimizer:
        config["zero_force_ds_cpu_optimizer"] = False
    if max_grad_norm:
        config["gradient_clipping"] = float(max_grad_norm)
    return config
