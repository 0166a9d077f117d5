"""The optimizer an `[optimizer]` section describes, over the model's trainable parameters.

Parameters are grouped by ditty.optim.groups: by default no weight decay on biases, norm scales
and embeddings (the usual rule of GPT-2, nanoGPT, torchtitan: decaying a norm's scale towards zero
only fights the normalisation), `optimizer.lr_multipliers` factors, and for muon the split between
Muon and AdamW. Build the optimizer after the model is parallelized: FSDP2 replaces parameters
with sharded ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ditty.config.errors import Problem, RecipeError
from ditty.config.sections import OptimizerConfig

if TYPE_CHECKING:
    import torch

# kind -> the backends that implement it; the first is the default.
BACKENDS: dict[str, tuple[str, ...]] = {
    "adamw": ("torch",),
    "radam": ("torch",),
    "sgd": ("torch",),
    # torchao first: it works with FSDP2 (DTensor) and torch.compile; bitsandbytes does not shard.
    "adamw8bit": ("torchao", "bnb"),
    "muon": ("torch",),
    "adafactor": ("torch",),
    "adamw_schedulefree": ("schedulefree",),
}


def check_optimizer(opt: OptimizerConfig) -> list[Problem]:
    """Problems with `[optimizer]` found without building anything (the recipe compiler calls this)."""
    backends = BACKENDS[opt.kind]
    if opt.backend == "default" or opt.backend in backends:
        return []
    fix = f"use {' or '.join(repr(b) for b in ('default',) + backends)}"
    if opt.backend in BACKENDS["adamw8bit"]:
        fix += ', or kind = "adamw8bit" for an 8-bit optimizer'
    return [Problem(key="optimizer.backend", message=f'kind "{opt.kind}" has no "{opt.backend}" backend', fix=fix)]


def resolve_backend(opt: OptimizerConfig) -> str:
    """The implementation `opt` selects; an impossible kind/backend pair is a RecipeError."""
    problems = check_optimizer(opt)
    if problems:
        raise RecipeError(problems)
    return BACKENDS[opt.kind][0] if opt.backend == "default" else opt.backend


def param_groups(model: "torch.nn.Module", opt: OptimizerConfig) -> list[dict[str, Any]]:
    """Trainable parameters in the groups `opt` makes (ditty.optim.groups). Frozen parameters (a PEFT
    base model) are not handed to the optimizer at all, so they get no state."""
    from ditty.optim.groups import torch_param_groups

    return torch_param_groups(model, opt)


def build_optimizer(opt: OptimizerConfig, model: "torch.nn.Module") -> "torch.optim.Optimizer":
    """The optimizer for `model`'s trainable parameters: AdamW, RAdam, SGD, an 8-bit AdamW, Muon with
    AdamW, Adafactor or schedule-free AdamW."""
    backend = resolve_backend(opt)
    builder = _BUILDERS[(opt.kind, backend)]
    return builder(param_groups(model, opt), opt)


def _torch_adamw(groups: list[dict[str, Any]], opt: OptimizerConfig) -> "torch.optim.Optimizer":
    import torch

    return torch.optim.AdamW(groups, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps, **_kernel_choice(groups))


def _torch_radam(groups: list[dict[str, Any]], opt: OptimizerConfig) -> "torch.optim.Optimizer":
    """torch's RAdam (Liu et al. 2020) with AdamW's decoupled weight decay. Adam's first updates move
    every weight by the whole rate, whatever the gradient's size, because its second moment is
    estimated from a few steps; RAdam takes momentum-SGD steps until that estimate is reliable and
    scales the adaptive step by how reliable it is, a warmup tied to beta2 rather than to a schedule."""
    import torch

    return torch.optim.RAdam(groups, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps, decoupled_weight_decay=True)


def _torch_sgd(groups: list[dict[str, Any]], opt: OptimizerConfig) -> "torch.optim.Optimizer":
    import torch

    # torch 2.13 has no DTensor sharding rule for `_fused_sgd_` (AdamW's fused kernel has one): SGD on
    # FSDP2 or tensor-parallel parameters takes torch's default (foreach) instead of failing at the step.
    sharded = any(_is_dtensor(p) for group in groups for p in group["params"])
    return torch.optim.SGD(groups, lr=opt.lr, momentum=opt.momentum, **({} if sharded else _kernel_choice(groups)))


def _is_dtensor(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _torchao_adamw8bit(groups: list[dict[str, Any]], opt: OptimizerConfig) -> "torch.optim.Optimizer":
    # Cost: torchao compiles its update kernel once per parameter shape on the first step
    # (about 40 s for a small model on this 2-core CPU); later steps are fast.
    from torchao.optim import AdamW8bit

    return AdamW8bit(groups, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps)


def _bnb_adamw8bit(groups: list[dict[str, Any]], opt: OptimizerConfig) -> "torch.optim.Optimizer":
    # bitsandbytes keeps tensors under 4096 elements (min_8bit_size) in 32-bit state.
    from bitsandbytes.optim import AdamW8bit

    return AdamW8bit(groups, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps)


def _muon(groups: list[dict[str, Any]], opt: OptimizerConfig) -> "torch.optim.Optimizer":
    from ditty.optim.muon import MuonWithAdamW
    from ditty.optim.newton_schulz import ns_dtype

    adamw_groups = [group for group in groups if group["algorithm"] == "adamw"]
    devices = [p.device for group in groups if group["algorithm"] == "muon" for p in group["params"]]
    muon = dict(momentum=opt.muon_momentum, nesterov=True, ns_steps=opt.ns_steps, adjust_lr_fn=opt.adjust_lr_fn)
    if devices:
        muon["ns_dtype"] = ns_dtype(devices[0], opt.ns_dtype)
    return MuonWithAdamW(
        groups,
        muon=muon,
        adamw=dict(betas=tuple(opt.betas), eps=opt.eps, **_kernel_choice(adamw_groups)),
    )


def _torch_adafactor(groups: list[dict[str, Any]], opt: OptimizerConfig) -> "torch.optim.Optimizer":
    import torch

    return torch.optim.Adafactor(groups, lr=opt.lr)


def _schedulefree_adamw(groups: list[dict[str, Any]], opt: OptimizerConfig) -> "torch.optim.Optimizer":
    from ditty.optim.schedule_free import schedule_free_adamw

    # Warmup comes from [scheduler] (constant with warmup_steps), which scales the group rates the
    # same way schedulefree's own warmup_steps would.
    return schedule_free_adamw(groups, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps)


_BUILDERS: dict[tuple[str, str], Callable[[list, OptimizerConfig], "torch.optim.Optimizer"]] = {
    ("adamw", "torch"): _torch_adamw,
    ("radam", "torch"): _torch_radam,
    ("sgd", "torch"): _torch_sgd,
    ("adamw8bit", "torchao"): _torchao_adamw8bit,
    ("adamw8bit", "bnb"): _bnb_adamw8bit,
    ("muon", "torch"): _muon,
    ("adafactor", "torch"): _torch_adafactor,
    ("adamw_schedulefree", "schedulefree"): _schedulefree_adamw,
}


def _kernel_choice(groups: list[dict[str, Any]]) -> dict[str, bool]:
    """fused=True when every parameter sits on a device with torch's fused kernels (CPU included
    since torch 2.4), else torch's default (foreach where it can).

    On the CPU the fused kernels are about 3x faster than foreach for AdamW and 2x for SGD with
    momentum, and agree with foreach to 3e-8 (torch 2.13; figures in BENCHMARKS.md).
    """
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:  # a private helper: if a torch release moves it, fall back to the default
        return {}
    supported = set(_get_fused_kernels_supported_devices())
    fusable = all(p.device.type in supported and p.is_floating_point() for group in groups for p in group["params"])
    return {"fused": True} if fusable else {}
