"""Wrap a built model for data parallelism: DDP, or FSDP2 (`fully_shard`) per block then the root.

`apply_parallelism` takes the `[parallel]` section and the mesh from `ditty.parallel.mesh`. Call it
after every converter that replaces modules or parameters (PEFT, quantization, fp8), and before the
optimizer is built: FSDP2 replaces each parameter by a DTensor shard, and the optimizer must hold
those.
"""

from __future__ import annotations

import difflib
import warnings
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from ditty.config.errors import RecipeError
from ditty.config.sections import SHARDED_KINDS

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.device_mesh import DeviceMesh

    from ditty.config.sections import ParallelConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_PRECISION_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

CPU_OFFLOAD_WARNING = (
    "parallel.cpu_offload on a CPU device: parameters already live on the CPU, so offloading saves nothing here"
)
CPU_PIN_WARNING = (
    'parallel.pin_memory needs an accelerator (pinning raises "Cannot access accelerator device" on '
    "a CPU-only machine); offloading without pinned memory"
)


def apply_parallelism(
    model: nn.Module,
    parallel: "ParallelConfig",
    mesh: "Optional[DeviceMesh]",
    *,
    precision: str = "fp32",
    block_classes: Optional[list[type]] = None,
) -> nn.Module:
    """Return `model` wrapped for `parallel.kind` on `mesh` (unchanged for "none" or without a mesh).

    ddp returns a DistributedDataParallel wrapper; fsdp/hsdp shard in place and return the same
    module (now an FSDPModule). deepspeed is wrapped by its engine (see `ditty.parallel.deepspeed`),
    so it passes through here.
    """
    if mesh is None or parallel.kind in ("none", "deepspeed"):
        return model
    if parallel.kind == "ddp":
        return wrap_ddp(model, parallel, mesh)
    if parallel.kind in SHARDED_KINDS:
        return shard_fsdp(model, parallel, mesh, precision=precision, block_classes=block_classes)
    raise RecipeError.single(f"unknown parallel kind {parallel.kind!r}", key="parallel.kind")


def wrap_ddp(model: nn.Module, parallel: "ParallelConfig", mesh: "DeviceMesh") -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    device = next((p.device for p in model.parameters()), torch.device(mesh.device_type))
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        process_group=mesh.get_group(),
        find_unused_parameters=parallel.find_unused_parameters,
        gradient_as_bucket_view=parallel.gradient_as_bucket_view,
        static_graph=parallel.static_graph,
    )


def mixed_precision_policy(parallel: "ParallelConfig", precision: str):
    """FSDP2's MixedPrecisionPolicy: unset dtypes come from `train.precision`, gradients reduce in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def dtype(name):
        return _DTYPES[name] if name else None

    param = dtype(parallel.param_dtype) if parallel.param_dtype else _PRECISION_DTYPES.get(precision)
    # Reducing gradients in 16 bits loses the small ones; fp32 costs one cast per bucket.
    reduce = dtype(parallel.reduce_dtype) if parallel.reduce_dtype else (torch.float32 if param is not None else None)
    return MixedPrecisionPolicy(
        param_dtype=param,
        reduce_dtype=reduce,
        output_dtype=dtype(parallel.output_dtype),
        cast_forward_inputs=parallel.cast_forward_inputs,
    )


def offload_policy(parallel: "ParallelConfig", device_type: str):
    """CPUOffloadPolicy when asked; on a CPU device it warns and never pins (pinning raises there)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not parallel.cpu_offload:
        return OffloadPolicy()
    pin = parallel.pin_memory
    if device_type == "cpu":
        warnings.warn(CPU_OFFLOAD_WARNING, stacklevel=3)
        if pin:
            warnings.warn(CPU_PIN_WARNING, stacklevel=3)
            pin = False
    return CPUOffloadPolicy(pin_memory=pin)


def shard_fsdp(
    model: nn.Module,
    parallel: "ParallelConfig",
    mesh: "DeviceMesh",
    *,
    precision: str = "fp32",
    block_classes: Optional[list[type]] = None,
) -> nn.Module:
    """fully_shard each block (children before parents), then the root. Shards in place."""
    from torch.distributed.fsdp import fully_shard

    blocks = find_blocks(model, names=list(parallel.block_classes), classes=block_classes)
    # A parameter sharded in one unit and also held outside it loses the tie (FSDP2 gives each unit its
    # own DTensor): a block holding a weight tied to a module outside it (RoBERTa's embeddings, tied
    # to its masked-LM decoder) is left to the root unit, which shards it once.
    blocks = [block for block in blocks if not _tied_outside(block, model)]
    options = dict(
        mesh=mesh,
        mp_policy=mixed_precision_policy(parallel, precision),
        offload_policy=offload_policy(parallel, mesh.device_type),
    )
    for block in reversed(blocks):  # modules() lists parents first; FSDP2 wants the inner ones first
        fully_shard(block, reshard_after_forward=parallel.reshard_after_forward, **options)
    embeddings, head = _embeddings_and_head(model, blocks)
    # Their own units, as torchtitan does: otherwise they join the root, which stays gathered from
    # the first forward to the end of backward, and with a large vocabulary they are a big share of
    # the model (together 46% of a 106M Llama with 32k tokens) held whole on every rank.
    if embeddings is not None:
        fully_shard(embeddings, reshard_after_forward=parallel.reshard_after_forward, **options)
    if head is not None:
        # Last in forward, first in backward: resharding it in between would only gather it again.
        fully_shard(head, reshard_after_forward=False, **options)
    # The root keeps the rest (final norm; embeddings and head when tied). They are needed again at
    # the start of backward: None lets FSDP2 keep the root gathered after forward.
    fully_shard(model, reshard_after_forward=None if parallel.reshard_after_forward is not False else False, **options)
    return model


def _tied_outside(block: nn.Module, model: nn.Module) -> bool:
    inside = {id(m) for m in block.modules()}
    own = {id(p) for p in block.parameters()}
    return any(
        id(p) in own for module in model.modules() if id(module) not in inside for p in module.parameters(recurse=False)
    )


def _embeddings_and_head(model: nn.Module, blocks: list[nn.Module]) -> tuple[Optional[nn.Module], Optional[nn.Module]]:
    """A Hugging Face model's input embedding and output head, when they can be units of their own."""

    def get(name):
        getter = getattr(model, name, None)
        try:
            module = getter() if callable(getter) else None
        except (AttributeError, NotImplementedError):
            return None
        inside_block = module is not None and any(module is m for b in blocks for m in b.modules())
        return module if isinstance(module, nn.Module) and module is not model and not inside_block else None

    embeddings, head = get("get_input_embeddings"), get("get_output_embeddings")
    if embeddings is not None and head is not None:
        tied = {id(p) for p in embeddings.parameters()} & {id(p) for p in head.parameters()}
        if tied:  # one parameter cannot live in two units: leave both to the root
            return None, None
    return embeddings, head


def no_split_module_names(model: nn.Module) -> list[str]:
    """The Hugging Face `_no_split_modules` of the first module that declares any (PEFT wraps the model)."""
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None)
        if names:
            return list(names)
    return []


def find_blocks(
    model: nn.Module,
    *,
    names: Optional[list[str]] = None,
    classes: Optional[list[type]] = None,
    or_children: bool = False,
    skip: tuple[str, ...] = (),
) -> list[nn.Module]:
    """The modules to shard (or checkpoint, or compile) one by one, in `model.modules()` order.

    Chosen by, first match wins: `classes`; class `names` (the recipe's parallel.block_classes); the
    model's `_no_split_modules`; with `or_children`, the model's children (`model_children`); for a
    Hugging Face model, the classes an `nn.ModuleList` holds several of (a transformer's layers:
    DeBERTa-v2 declares no `_no_split_modules`). Raises RecipeError when named classes are absent or
    nothing is found.
    """
    if or_children and not (classes or names or no_split_module_names(model)):
        return model_children(model, skip=skip)
    if classes:
        wanted = tuple(classes)
        blocks = [m for m in model.modules() if isinstance(m, wanted) and m is not model]
        key, asked = "parallel.block_classes", [c.__name__ for c in classes]
    else:
        asked = list(names or []) or no_split_module_names(model)
        if not asked and _holds_transformers_model(model):
            asked = repeated_block_names(model)
        key = "parallel.block_classes"
        blocks = [m for m in model.modules() if type(m).__name__ in asked and m is not model]
    if blocks:
        return blocks
    present = sorted({type(m).__name__ for m in model.modules()})
    if asked:
        close = sorted({c for name in asked for c in difflib.get_close_matches(name, present, n=2)})
        raise RecipeError.single(
            f"no module of class {', '.join(asked)} in the model",
            key=key,
            fix=f"did you mean {', '.join(close)}?"
            if close
            else f"name block classes the model has, e.g. {', '.join(present[:6])}",
        )
    raise RecipeError.single(
        "the model declares no blocks to shard (no _no_split_modules)",
        key=key,
        fix=f"name the repeated block class, e.g. one of {', '.join(present[:6])}",
    )


def model_children(model: nn.Module, *, skip: tuple[str, ...] = ()) -> list[nn.Module]:
    """The parts of a model that declares no blocks: its children that hold parameters, looking
    through single-child wrappers (PEFT's PeftModel -> LoraModel -> the model) and into containers
    (ModuleList, ModuleDict), which are iterated rather than called. `skip` names children to leave
    out (the trainer's `ditty_loss`, which forward never calls)."""
    module = model
    while True:
        children = [(n, c) for n, c in module.named_children() if n not in skip and _holds_parameters(c)]
        if len(children) != 1:
            break
        module = children[0][1]
    if not children:
        return [module] if module is not model else []
    out: list[nn.Module] = []
    for _, child in children:
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            out += [c for c in child.children() if _holds_parameters(c)]
        else:
            out.append(child)
    return out


def _holds_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _holds_transformers_model(model: nn.Module) -> bool:
    """A Hugging Face model (possibly inside PEFT or compile wrappers): its repeated layers are its
    blocks. A custom model names its blocks (parallel.block_classes) instead of having them guessed."""
    return any(type(m).__module__.startswith("transformers.models.") for m in model.modules())


def repeated_block_names(model: nn.Module) -> list[str]:
    """Class names of the modules that an `nn.ModuleList` holds two or more of, in model order."""
    found: dict[str, None] = {}
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            names = [type(child).__name__ for child in module]
            found.update((name, None) for name in names if names.count(name) > 1)
    return list(found)
