"""Quantized loading of pretrained weights through bitsandbytes: the base of QLoRA and 8-bit LoRA.

`[quant]` becomes a transformers `BitsAndBytesConfig` that `build_model` passes to `from_pretrained`,
so the weights are quantized as they load and the full-precision model never exists in memory.
Quantized *random* init is refused: fresh random weights quantized to 4 bits and then frozen
train nothing useful (only an adapter would learn, on top of noise).

Which combinations work (8-bit under FSDP, DoRA on 8-bit, merging) is the recipe compiler's table
(ditty/recipe/compatibility_rules.py); this module assumes a recipe that passed it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ditty.config.sections import QuantConfig

if TYPE_CHECKING:
    import torch
    from transformers import BitsAndBytesConfig


def is_quantized(quant: "QuantConfig | None") -> bool:
    return quant is not None and quant.kind != "none"


def bnb_config(quant: QuantConfig) -> "BitsAndBytesConfig":
    """The transformers `BitsAndBytesConfig` of a `[quant]` section (kind "bnb-4bit" or "bnb-8bit").

    4-bit: `quant_type` (nf4/fp4), `double_quant`, `compute_dtype` (what the dequantized weights
    are multiplied in) and `storage_dtype` (`bnb_4bit_quant_storage`: the dtype the packed bytes
    are viewed as; FSDP needs it equal to the other parameters' dtype to flatten a block, uint8
    otherwise). 8-bit: LLM.int8 with transformers' defaults (outlier threshold 6.0).
    """
    import torch
    from transformers import BitsAndBytesConfig

    if quant.kind == "bnb-4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=quant.quant_type,
            bnb_4bit_use_double_quant=quant.double_quant,
            bnb_4bit_compute_dtype=getattr(torch, quant.compute_dtype),
            bnb_4bit_quant_storage=getattr(torch, quant.storage_dtype),
        )
    if quant.kind == "bnb-8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"quant.kind = {quant.kind!r} has no bitsandbytes config")  # the caller checks is_quantized


def prepare_quantized_for_training(model: "torch.nn.Module", *, upcast_to_fp32: bool = True) -> "torch.nn.Module":
    """Freeze every base parameter of a bitsandbytes-loaded model, and (by default) run peft's
    `prepare_model_for_kbit_training` without gradient checkpointing.

    What peft's function does, read from peft 0.21: (1) sets requires_grad = False on every
    parameter; (2) casts every fp16/bf16 parameter that is not 4-bit packed (embeddings, norms,
    lm_head, the 8-bit layers' biases) to fp32, for stable norms and a full-precision head; (3) only
    with gradient checkpointing: turns it on and makes the input embeddings' output require grad.
    On the CPU in fp32, (2) changes nothing. On a GPU with `model.dtype = "bfloat16"` it costs 2
    extra bytes per non-quantized parameter (about 1 GB for Llama-3-8B's embedding and head).

    Gradient checkpointing is never turned on here: it is `train.activation_checkpointing`, applied
    by the trainer. `upcast_to_fp32 = False` only freezes: use it under FSDP, which needs all
    parameters of a block in one dtype (the 4-bit storage dtype), or to keep `model.dtype` as asked.
    """
    if not upcast_to_fp32:
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        return model
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def keep_4bit_layout_fixed(model: "torch.nn.Module") -> "torch.nn.Module":
    """Stop bitsandbytes from repacking 4-bit weights for its CPU inference kernel.

    bitsandbytes 0.50, on a CPU with AVX512-BF16, rewrites a `Linear4bit`'s
    weight the first time the layer runs in eval mode without grad (a validation pass, or
    generation): it repacks the nibbles, rounds the block scales (absmax) to bf16, and un-nests the
    double quantization. The rewrite is permanent: back in training, the inverse re-quantizes
    the scales, so the frozen base drifts after every evaluation, the eval and train forwards of
    the same weights differ, and a merged export no longer matches. With the flag off, every
    forward dequantizes the original weights (the same path training uses); inference on CPU is
    slower, which does not matter for training. GPUs never take this path.
    """
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
    return model


def dequantize_4bit_weight(parameter: "torch.Tensor") -> "torch.Tensor":
    """The dense weight a `Linear4bit` multiplies with (dtype: the dtype it was quantized from),
    without modifying the parameter, even when bitsandbytes repacked it for its CPU kernel."""
    import copy

    import bitsandbytes.functional as bnbf

    quant_state = parameter.quant_state
    data = parameter.data
    if getattr(quant_state, "packing_format_for_cpu", False):
        # Undo the CPU repacking on copies (the inverse mutates the state it is given).
        data, quant_state = bnbf._convert_weight_packed_for_cpu_inverse(data.clone(), copy.deepcopy(quant_state))
    return bnbf.dequantize_4bit(data, quant_state)


def quantized_linear_count(model: "torch.nn.Module") -> dict[str, int]:
    """How many bitsandbytes `Linear4bit` and `Linear8bitLt` modules the model holds (peft's
    adapter wrappers are not counted, their base layers are)."""
    import bitsandbytes as bnb

    counts = {"Linear4bit": 0, "Linear8bitLt": 0}
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            counts["Linear4bit"] += 1
        elif isinstance(module, bnb.nn.Linear8bitLt):
            counts["Linear8bitLt"] += 1
    return counts


# --- low-memory FSDP + QLoRA: rank 0 quantizes, the other ranks build the same modules on meta ---

_LAYER_ATTRS_SKIPPED = ("training", "quant_state")
_WEIGHT_ATTRS = ("blocksize", "compress_statistics", "quant_type", "quant_storage", "bnb_quantized")
_MODEL_ATTRS = ("is_quantized", "quantization_method", "hf_quantizer", "is_loaded_in_4bit", "is_loaded_in_8bit")


def quantized_skeleton(model: "torch.nn.Module") -> dict:
    """What another rank needs to rebuild this bitsandbytes 4-bit model on the meta device, without
    reading or quantizing a weight: the (final) config, every `Linear4bit` with its packed weight's
    shape, dtype and quantization settings, the model-level quantization attributes transformers
    sets, and the name, shape and dtype of every parameter and buffer (to check the rebuild). Small:
    no tensor data (the quant states follow after sharding, `share_4bit_quant_states`).
    """
    import bitsandbytes as bnb

    layers = {}
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear8bitLt):
            raise ValueError("the low-memory build handles 4-bit bases only, not 8-bit")
        if isinstance(module, bnb.nn.Linear4bit):
            weight = module.weight
            layers[name] = {
                "attrs": {
                    k: v for k, v in vars(module).items() if not k.startswith("_") and k not in _LAYER_ATTRS_SKIPPED
                },
                "bias": module.bias is not None,
                "weight": (tuple(weight.shape), weight.dtype, {a: getattr(weight, a) for a in _WEIGHT_ATTRS}),
            }
    return {
        "config": model.config,
        "dtype": model.dtype,
        "training": model.training,
        "layers": layers,
        "model_attrs": {k: getattr(model, k) for k in _MODEL_ATTRS if k in vars(model)},
        "tensors": _tensor_specs(model),
    }


def _tensor_specs(model: "torch.nn.Module") -> dict:
    specs = {name: (tuple(p.shape), p.dtype) for name, p in model.named_parameters(remove_duplicate=False)}
    specs.update({name: (tuple(b.shape), b.dtype) for name, b in model.named_buffers(remove_duplicate=False)})
    return specs


def rebuild_quantized_on_meta(model: "torch.nn.Module", skeleton: dict) -> "torch.nn.Module":
    """Turn `model` (built from `skeleton["config"]` with meta parameters) into rank 0's quantized
    model: the same `Linear4bit` modules with meta packed weights, the same dtypes and attributes.
    Raises ValueError when a parameter or buffer still differs from rank 0's (name, shape)."""
    import bitsandbytes as bnb
    import torch

    for name, layer in skeleton["layers"].items():
        old = model.get_submodule(name)
        with torch.device("meta"):
            new = bnb.nn.Linear4bit(old.in_features, old.out_features, bias=layer["bias"])
        new.__dict__.update(layer["attrs"])
        shape, dtype, settings = layer["weight"]
        new.weight = bnb.nn.Params4bit(
            torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False, module=new, **settings
        )
        if layer["bias"]:
            new.bias = old.bias
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
    for key, value in skeleton["model_attrs"].items():
        setattr(model, key, value)
    for key in ("quantization_config", "_is_quantized"):  # what transformers set on rank 0's config
        if key in vars(skeleton["config"]):
            setattr(model.config, key, getattr(skeleton["config"], key))
    model.train(skeleton["training"])
    _match_dtypes(model, skeleton["tensors"])
    return model


def _match_dtypes(model: "torch.nn.Module", specs: dict) -> None:
    """Cast each parameter / buffer to rank 0's dtype (free on meta), then check names and shapes."""
    import torch

    cast: dict[int, torch.nn.Parameter] = {}  # tied parameters stay one parameter
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, param in list(module._parameters.items()):
            want = specs.get(f"{prefix}.{name}".lstrip("."))
            if param is not None and want is not None and param.dtype != want[1] and type(param) is torch.nn.Parameter:
                if id(param) not in cast:
                    cast[id(param)] = torch.nn.Parameter(param.to(want[1]), requires_grad=param.requires_grad)
                module._parameters[name] = cast[id(param)]
        for name, buffer in list(module._buffers.items()):
            want = specs.get(f"{prefix}.{name}".lstrip("."))
            if buffer is not None and want is not None and buffer.dtype != want[1]:
                module._buffers[name] = buffer.to(want[1])
    mine = _tensor_specs(model)
    if mine != specs:
        differ = sorted(set(mine) ^ set(specs)) or sorted(n for n in mine if mine[n] != specs[n])
        name = differ[0]
        raise ValueError(
            f"the meta-device model differs from rank 0's quantized model at {name}: "
            f"{mine.get(name)} here, {specs.get(name)} on rank 0"
        )


def share_4bit_quant_states(model: "torch.nn.Module", device: "torch.device | str" = "cpu") -> int:
    """Give every rank's `Linear4bit` rank 0's quantization state (block scales, code, shape, dtype).

    FSDP shards the packed weights; the quant states are small (1/32 of the packed bytes with double
    quantization) and every rank needs them whole, so rank 0 sends each one (one small object
    broadcast per layer) and the others set `module.quant_state`, which bitsandbytes copies onto the
    gathered weight at each forward. Returns how many layers were sent. Every rank must call it.
    """
    import copy

    import bitsandbytes as bnb
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return 0
    rank = dist.get_rank()
    count = 0
    for module in model.modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        state = module.quant_state if rank == 0 else None
        if rank == 0 and state is not None and any(t.device.type != "cpu" for t in _state_tensors(state)):
            state = copy.deepcopy(state)
            state.to("cpu")  # pickled tensors would otherwise name rank 0's GPU
        box = [state]
        dist.broadcast_object_list(box, src=0)
        if rank != 0:
            if box[0] is None:
                raise ValueError("rank 0 has a Linear4bit layer without a quantization state")
            box[0].to(torch.device(device))
            module.quant_state = box[0]
        count += 1
    return count


def _state_tensors(state) -> list:
    import torch

    found = [v for v in vars(state).values() if isinstance(v, torch.Tensor)]
    nested = getattr(state, "state2", None)
    return found + (_state_tensors(nested) if nested is not None else [])


# --- a model given as an instance (the Python API): its linear layers replaced and quantized -------


def quantize_instance(model: "torch.nn.Module", quant: "QuantConfig | None", device) -> "torch.nn.Module":
    """The Python API's model on `device`, quantized as `[quant]` asks, the way bitsandbytes quantizes a
    loaded model: every `nn.Linear` becomes a `Linear4bit` (or `Linear8bitLt`) holding its weights,
    quantized as it moves to the device. A transformers model keeps the layers transformers keeps
    (its output embedding, `get_keys_to_not_convert`); a model already quantized is left as it is.
    Never a silent no-op: with `quant.kind` set, the result holds quantized layers or this raises."""
    import torch

    if not is_quantized(quant):
        return model.to(device)
    if any(quantized_linear_count(model).values()):
        return model.to(device)  # the caller quantized it already
    keep = _modules_kept_in_full_precision(model)
    replaced = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full_name = f"{name}.{child_name}" if name else child_name
            if type(child) is torch.nn.Linear and not any(full_name == k or full_name.endswith("." + k) for k in keep):
                setattr(module, child_name, _quantized_linear(child, quant))
                replaced += 1
    if not replaced:
        from ditty.config.errors import RecipeError

        raise RecipeError.single(
            "quant.kind is set but the given model has no torch.nn.Linear layer to quantize",
            key="quant.kind",
            fix='set quant.kind = "none", or give a model with linear layers',
        )
    model = model.to(device)
    flag = "is_loaded_in_4bit" if quant.kind == "bnb-4bit" else "is_loaded_in_8bit"
    object.__setattr__(model, flag, True)  # what transformers marks a quantized load with (peft reads it)
    return keep_4bit_layout_fixed(model) if quant.kind == "bnb-4bit" else model


def _modules_kept_in_full_precision(model: "torch.nn.Module") -> list[str]:
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        return []
    from transformers.quantizers.base import get_keys_to_not_convert

    # Names of weights or modules (its last parameter's name among them): keep the modules they name.
    return sorted({key.removesuffix(".weight").removesuffix(".bias") for key in get_keys_to_not_convert(model)})


def _quantized_linear(linear: "torch.nn.Linear", quant: QuantConfig) -> "torch.nn.Module":
    import bitsandbytes as bnb
    import torch

    weight = linear.weight.data.clone()
    if quant.kind == "bnb-4bit":
        storage = getattr(torch, quant.storage_dtype)
        layer = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            compute_dtype=getattr(torch, quant.compute_dtype),
            compress_statistics=quant.double_quant,
            quant_type=quant.quant_type,
            quant_storage=storage,
        )
        layer.weight = bnb.nn.Params4bit(
            weight,
            requires_grad=False,
            compress_statistics=quant.double_quant,
            quant_type=quant.quant_type,
            quant_storage=storage,
        )
    else:
        layer = bnb.nn.Linear8bitLt(
            linear.in_features, linear.out_features, bias=linear.bias is not None, has_fp16_weights=False
        )
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    if linear.bias is not None:
        layer.bias = torch.nn.Parameter(linear.bias.data.clone(), requires_grad=linear.bias.requires_grad)
    return layer
