"""Quantized loading of pretrained weights through bitsandbytes: the base of QLoRA and 8-bit LoRA.

`[quant]` becomes a transformers `BitsAndBytesConfig` that `build_model` passes to `from_pretrained`,
so the weights are quantized as they load and the full-precision model never exists in memory.
Quantized *random* init is refused: fresh random weights quantized to 4 bits and then frozen
train nothing useful (only an adapter would learn, on top of noise).

Which combinations work (8-bit under FSDP, DoRA on 8-bit, merging) is the recipe compiler's table
(ditty/recipe/compat.py); this module assumes a recipe that passed it.
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

    bitsandbytes 0.50, on a CPU with AVX512-BF16 (this machine has it), rewrites a `Linear4bit`'s
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
