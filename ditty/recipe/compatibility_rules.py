"""Which choices of quantization, adapters, sharding, optimizer and precision work together.

One table: each row is a rule id, the condition under which a recipe breaks (or a setting does
nothing), the message and the fix. `ditty check` evaluates every row; the compatibility table of
docs/recipes/compiler.md is generated from it (`python -m ditty.recipe.compatibility_rules`) and a test keeps
the two in step. Each row has a test with a failing recipe in tests/recipe/test_compat.py.

The conditions read only the config (and, for hardware rows, what is importable or present),
never weights.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Literal

from ditty.config.sections import SHARDED_KINDS
from ditty.optim import check_optimizer

_DTYPE_OF_PRECISION = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class CompatRule:
    id: str
    key: str
    """The dotted key the problem is reported on."""
    when: Callable[[Any], bool]
    """True when the recipe hits the problem."""
    message: str
    fix: str
    severity: Literal["error", "warning"] = "error"
    condition: str = ""
    """The condition in words, for the docs table."""


def fsdp_param_dtype(cfg: Any) -> str:
    """The dtype FSDP keeps (and gathers) parameters in: the mixed-precision policy, else storage."""
    if cfg.parallel.param_dtype:
        return cfg.parallel.param_dtype
    if cfg.model.dtype != "auto":
        return cfg.model.dtype
    return "float32"


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def _fp8_hardware_missing(cfg: Any) -> bool:
    if not cfg.fp8.enabled or cfg.fp8.backend != "torchao" or cfg.fp8.emulate:
        return False
    if cfg.run.device == "cpu":
        return True
    import torch  # only for recipes that ask for FP8; the check needs the device's capability

    return not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9)


def _fp32_head(cfg: Any) -> bool:
    """The output head computes in fp32: no autocast, and weights that are fp32 before they load
    (model.dtype "auto" keeps a checkpoint's own dtype on a GPU, which may be bf16; the loss then
    checks the tensors it gets)."""
    weights_fp32 = cfg.model.dtype == "float32" or (cfg.model.dtype == "auto" and not cfg.model.path)
    return cfg.train.precision == "fp32" and weights_fp32


def _gpu_loss_kernel_without_cuda(cfg: Any) -> bool:
    if cfg.train.loss_chunks <= 0 or cfg.train.loss_backend not in ("liger", "cce"):
        return False
    if cfg.run.device == "cpu":
        return True
    import torch  # only for recipes that ask for a GPU loss kernel

    return not torch.cuda.is_available()


COMPAT_RULES: list[CompatRule] = [
    CompatRule(
        "compat.bnb-8bit-optimizer-fsdp",
        "optimizer.backend",
        lambda c: c.optimizer.kind == "adamw8bit" and c.optimizer.backend == "bnb" and c.parallel.kind in SHARDED_KINDS,
        "bitsandbytes' 8-bit AdamW fails on FSDP's sharded (DTensor) parameters",
        'set optimizer.backend = "torchao" (its AdamW8bit works with FSDP2)',
        condition='optimizer.kind = "adamw8bit", backend = "bnb", parallel.kind fsdp or hsdp',
    ),
    CompatRule(
        "compat.8bit-optimizer-cpu-offload",
        "parallel.cpu_offload",
        lambda c: c.optimizer.kind == "adamw8bit" and c.parallel.kind in SHARDED_KINDS and c.parallel.cpu_offload,
        "8-bit optimizers do not work with FSDP CPU offload (the state is created on the wrong device)",
        'set optimizer.kind = "adamw" or parallel.cpu_offload = false',
        condition="adamw8bit with FSDP cpu_offload",
    ),
    CompatRule(
        "compat.optimizer-backend",
        "optimizer.backend",
        lambda c: bool(check_optimizer(c.optimizer)),  # the optimizer package's own backend table
        "this backend has no implementation of the chosen optimizer kind",
        'adamw, sgd, muon and adafactor: backend "torch"; adamw8bit: "torchao" or "bnb"; adamw_schedulefree: '
        '"schedulefree" (or "default" for each)',
        condition="a backend that does not implement the kind (e.g. muon with torchao or bnb: there is no 8-bit Muon)",
    ),
    CompatRule(
        "compat.muon-fsdp",
        "optimizer.kind",
        lambda c: c.optimizer.kind == "muon" and c.parallel.kind in SHARDED_KINDS,
        "Muon orthogonalises each whole weight matrix (Newton-Schulz); FSDP2/HSDP give each rank a shard of it, "
        "and Muon on shards computes a different, wrong update",
        'use parallel.kind = "ddp" (or one process) with muon, or optimizer.kind = "adamw" with fsdp/hsdp',
        condition='optimizer.kind = "muon", parallel.kind fsdp or hsdp',
    ),
    CompatRule(
        "compat.adafactor-fsdp",
        "optimizer.kind",
        lambda c: c.optimizer.kind == "adafactor" and c.parallel.kind in SHARDED_KINDS,
        "Adafactor's factored second moment averages over all rows of a matrix and scales by its whole norm; "
        "FSDP2/HSDP give each rank a shard of the rows, so the update would be wrong",
        'use parallel.kind = "ddp" (or one process) with adafactor, or optimizer.kind = "adamw" with fsdp/hsdp',
        condition='optimizer.kind = "adafactor", parallel.kind fsdp or hsdp',
    ),
    CompatRule(
        "compat.deepspeed-optimizer-kind",
        "optimizer.kind",
        lambda c: c.parallel.kind == "deepspeed" and c.optimizer.kind in ("muon", "adafactor", "adamw_schedulefree"),
        "ZeRO hands the optimizer flat 1-D partitions of the parameters: Muon and Adafactor need the matrices, "
        "and schedule-free's weight switch would not reach the model's weights",
        'use parallel.kind = "ddp" with this optimizer, or optimizer.kind = "adamw" with deepspeed',
        condition="muon, adafactor or adamw_schedulefree with deepspeed",
    ),
    CompatRule(
        "compat.schedulefree-scheduler",
        "scheduler.kind",
        lambda c: c.optimizer.kind == "adamw_schedulefree" and c.scheduler.kind != "constant",
        "schedule-free AdamW replaces the learning-rate schedule (it averages the iterates); a decaying schedule "
        "on top of it fights the averaging",
        'set scheduler.kind = "constant" (scheduler.warmup_steps still warms up)',
        condition="adamw_schedulefree with a scheduler other than constant",
    ),
    CompatRule(
        "compat.schedulefree-missing",
        "optimizer.kind",
        lambda c: c.optimizer.kind == "adamw_schedulefree" and _missing("schedulefree"),
        "schedule-free AdamW comes from the schedulefree package, which is not installed",
        "pip install 'ditty[schedulefree]' (or pip install schedulefree)",
        condition="adamw_schedulefree without the schedulefree package",
    ),
    CompatRule(
        "compat.quantized-needs-adapter",
        "quant.kind",
        lambda c: c.quant.kind != "none" and c.peft.kind == "none",
        "quantized base weights cannot be trained; quantized loading needs an adapter (QLoRA)",
        'set peft.kind = "lora" (or "dora"), or quant.kind = "none" for full finetuning',
        condition='quant.kind set, peft.kind = "none"',
    ),
    CompatRule(
        "compat.quant-needs-pretrained",
        # On the model's key: in the Python API a model instance stands in for [model] and is quantized as given.
        "model.init",
        lambda c: c.quant.kind != "none" and (bool(c.model.factory) or c.model.resolved_init == "random"),
        "is a random init (or a model.factory), and quant.kind asks for quantized loading, which needs pretrained "
        "Hugging Face weights: random weights quantized to 4 or 8 bits and then frozen would leave only the "
        "adapter to learn, on top of noise",
        'set quant.kind = "none", or load a pretrained model (model.path with model.init = "pretrained")',
        condition="quant.kind set on a random init or a model.factory",
    ),
    CompatRule(
        "compat.qlora-fsdp-storage-dtype",
        "quant.storage_dtype",
        lambda c: (
            c.quant.kind == "bnb-4bit"
            and c.parallel.kind in SHARDED_KINDS
            and c.quant.storage_dtype != fsdp_param_dtype(c)
        ),
        "FSDP shards all parameters of a block as one flat dtype: the 4-bit storage dtype must equal the "
        "FSDP parameter dtype",
        "set quant.storage_dtype to the FSDP parameter dtype (parallel.param_dtype, else model.dtype, else float32)",
        condition="bnb-4bit under fsdp/hsdp with storage dtype != parameter dtype",
    ),
    CompatRule(
        "compat.8bit-loading-fsdp",
        "quant.kind",
        lambda c: c.quant.kind == "bnb-8bit" and c.parallel.kind in SHARDED_KINDS,
        "LLM.int8 weights (int8 with separate scale buffers) cannot be sharded by FSDP",
        'use quant.kind = "bnb-4bit" with a storage dtype (QLoRA), or parallel.kind = "ddp"',
        condition="bnb-8bit under fsdp/hsdp",
    ),
    CompatRule(
        "compat.quant-deepspeed",
        "quant.kind",
        lambda c: c.quant.kind != "none" and c.parallel.kind == "deepspeed",
        "DeepSpeed ZeRO does not partition bitsandbytes-quantized weights",
        'use parallel.kind = "fsdp" for QLoRA across processes, or "ddp"',
        condition="quantized loading with deepspeed",
    ),
    CompatRule(
        "compat.merge-8bit",
        "checkpoint.final_format",
        lambda c: c.checkpoint.final_format == "merged" and c.quant.kind == "bnb-8bit",
        "an adapter cannot be merged into LLM.int8 weights without losing it to rounding",
        'keep checkpoint.final_format = "auto" (the adapter is saved), or train with quant.kind = "bnb-4bit"',
        condition="merged final model from an 8-bit base",
    ),
    CompatRule(
        "compat.merge-4bit-dequantized",
        "checkpoint.final_format",
        lambda c: c.checkpoint.final_format == "merged" and c.quant.kind == "bnb-4bit",
        "the merged model is the adapter merged into the DEQUANTIZED 4-bit weights: it matches the QLoRA model, "
        "not the original full-precision base plus adapter",
        "nothing to do if that is what you want",
        severity="warning",
        condition="merged final model from a 4-bit base",
    ),
    CompatRule(
        "compat.merge-needs-adapter",
        "checkpoint.final_format",
        lambda c: c.checkpoint.final_format == "merged" and c.peft.kind == "none",
        "there is no adapter to merge: a full finetune already saves a full model",
        'remove checkpoint.final_format = "merged"',
        severity="warning",
        condition="merged final model without an adapter",
    ),
    CompatRule(
        "compat.dora-8bit",
        "peft.kind",
        lambda c: c.peft.kind == "dora" and c.quant.kind == "bnb-8bit",
        "DoRA on LLM.int8 layers crashes in the forward pass with peft 0.21 (see tests/recipe/test_compat.py)",
        'use peft.kind = "lora" with 8-bit loading, or quant.kind = "bnb-4bit" for DoRA',
        condition="dora with bnb-8bit",
    ),
    CompatRule(
        "compat.fp8-hardware",
        "fp8.emulate",
        _fp8_hardware_missing,
        "FP8 training needs a CUDA GPU of compute capability 8.9 or newer (H100, Ada), and this run has none",
        "set fp8.emulate = true to run the FP8 code path emulated (slow; for tests), or disable fp8",
        condition="fp8 (torchao) without emulation on a device older than sm_89",
    ),
    CompatRule(
        "compat.fp8-without-compile",
        "train.compile",
        lambda c: c.fp8.enabled and c.fp8.backend == "torchao" and not c.fp8.emulate and not c.train.compile,
        "torchao's float8 linears cast in separate kernels unless compiled: a ~1B Llama on an H100 trained at"
        " 0.46x the tokens/s of plain bf16 (BENCHMARKS.md)",
        "set train.compile = true with fp8",
        severity="warning",
        condition="fp8 (torchao) without train.compile",
    ),
    CompatRule(
        "compat.fp8-te-missing",
        "fp8.backend",
        lambda c: c.fp8.enabled and c.fp8.backend == "te" and _missing("transformer_engine"),
        "Transformer Engine is not installed (the `transformer_engine` package is missing; it needs CUDA)",
        "pip install 'ditty[te]' on a CUDA machine, or use fp8.backend = \"torchao\"",
        condition='fp8.backend = "te" and transformer_engine not importable',
    ),
    CompatRule(
        "compat.deepspeed-missing",
        "parallel.kind",
        lambda c: c.parallel.kind == "deepspeed" and _missing("deepspeed"),
        "DeepSpeed is not installed (an optional extra; it builds from source)",
        "pip install 'ditty[deepspeed]', or use parallel.kind = \"fsdp\"",
        condition='parallel.kind = "deepspeed" and deepspeed not importable',
    ),
    CompatRule(
        "compat.deepspeed-compile",
        "train.compile",
        lambda c: c.parallel.kind == "deepspeed" and c.train.compile,
        "torch.compile is not wired into the DeepSpeed engine (ZeRO-3 gathers parameters in module hooks "
        "that compiled blocks would trace)",
        'set train.compile = false with deepspeed, or use parallel.kind = "fsdp" (compile works with FSDP2)',
        condition="train.compile with deepspeed",
    ),
    CompatRule(
        "compat.deepspeed-fp8",
        "fp8.enabled",
        lambda c: c.parallel.kind == "deepspeed" and c.fp8.enabled,
        "FP8 training is wired for one process and FSDP2 (its scales follow FSDP2's shards), not the DeepSpeed engine",
        'use parallel.kind = "fsdp" for FP8 across processes',
        condition="fp8 with deepspeed",
    ),
    CompatRule(
        "compat.deepspeed-8bit-optimizer",
        "optimizer.kind",
        lambda c: c.parallel.kind == "deepspeed" and c.optimizer.kind == "adamw8bit",
        "ZeRO hands the optimizer flat fp32 partitions of the parameters; 8-bit AdamW on them is not tested with ditty",
        'use optimizer.kind = "adamw" (parallel.offload_optimizer = true moves its state to the CPU), or 8-bit '
        'AdamW with parallel.kind = "fsdp"',
        condition="adamw8bit with deepspeed",
    ),
    CompatRule(
        "compat.fp16-weights-with-scaler",
        "model.dtype",
        lambda c: c.train.precision == "fp16" and c.model.dtype == "float16" and c.peft.kind == "none",
        "fp16 loss scaling cannot unscale gradients of float16 weights "
        "(torch raises 'Attempting to unscale FP16 gradients')",
        'keep model.dtype = "float32" (autocast computes in fp16), or use bf16',
        condition="train.precision fp16 with float16 trainable weights",
    ),
    CompatRule(
        "compat.liger-missing",
        "train.loss_backend",
        lambda c: c.train.loss_chunks > 0 and c.train.loss_backend == "liger" and _missing("liger_kernel"),
        "liger-kernel is not installed (the `liger_kernel` package is missing; its Triton kernels need CUDA)",
        'pip install liger-kernel on a CUDA machine, or use train.loss_backend = "chunked" (or "auto")',
        condition='train.loss_backend = "liger" and liger_kernel not importable',
    ),
    CompatRule(
        "compat.cce-missing",
        "train.loss_backend",
        lambda c: c.train.loss_chunks > 0 and c.train.loss_backend == "cce" and _missing("cut_cross_entropy"),
        "cut-cross-entropy is not installed (the `cut_cross_entropy` package is missing; its kernels need CUDA)",
        'pip install cut-cross-entropy on a CUDA machine, or use train.loss_backend = "chunked" (or "auto")',
        condition='train.loss_backend = "cce" and cut_cross_entropy not importable',
    ),
    CompatRule(
        "compat.cce-fp32",
        "train.loss_backend",
        lambda c: c.train.loss_chunks > 0 and c.train.loss_backend == "cce" and _fp32_head(c),
        "cut-cross-entropy computes in bf16 or fp16 only (its backward refuses fp32 inputs); this run trains in fp32",
        'set train.precision = "bf16", or train.loss_backend = "chunked" (or "auto": it passes cce over in fp32)',
        condition='train.loss_backend = "cce" with train.precision = "fp32" and fp32 weights',
    ),
    CompatRule(
        "compat.loss-kernel-cuda",
        "train.loss_backend",
        _gpu_loss_kernel_without_cuda,
        "the liger and cce loss backends are Triton kernels: they run on CUDA only, and this run has no GPU",
        'use train.loss_backend = "chunked" (pure PyTorch, any device) or "auto"',
        condition='train.loss_backend "liger" or "cce" on a run without CUDA',
    ),
    CompatRule(
        "compat.wandb-missing",
        "logging.wandb",
        lambda c: c.logging.wandb and _missing("wandb"),
        "wandb is not installed",
        "pip install 'ditty[wandb]', or set logging.wandb = false",
        condition="logging.wandb without the wandb package",
    ),
]


def compat_table_markdown() -> str:
    rows = ["| rule | when | what happens | fix |", "|---|---|---|---|"]
    for rule in COMPAT_RULES:
        kind = "" if rule.severity == "error" else " (warning)"
        rows.append(f"| `{rule.id}`{kind} | {rule.condition} | {rule.message} | {rule.fix} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(compat_table_markdown())
