"""The activation model against what autograd really saves: every tensor a Hugging Face Llama
layer keeps for the backward (saved_tensors_hooks, each storage once, parameters excluded), full
finetune and LoRA, fp32 and bf16 autocast, padded and unpadded micro-batches."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ditty.config import TrainerConfig
from ditty.config.sections import DataConfig, ModelConfig, PeftConfig, QuantConfig, RunConfig, TrainConfig
from ditty.plan import Target, make_plan

SIZES = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2)
SEQ = 24


@pytest.fixture(scope="module")
def llama_dirs(tmp_path_factory):
    """Tiny Llamas of 1 and 2 layers, saved in Hugging Face format (QLoRA loads from disk)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    dirs = {}
    for layers in (1, 2):
        torch.manual_seed(0)
        path = tmp_path_factory.mktemp(f"llama{layers}")
        LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, tie_word_embeddings=False, **SIZES)).save_pretrained(
            path
        )
        dirs[layers] = str(path)
    return dirs


def saved_bytes(model, ids, mask, autocast: bool, **inputs) -> int:
    """Bytes of the distinct storages autograd saves in a forward, parameters excluded."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), context:
        model(input_ids=ids, attention_mask=mask, **inputs)
    return sum(seen.values())


def recipe(
    path, *, dtype="float32", precision="fp32", peft="none", quant="none", micro=1, packing=False, packed="auto"
) -> TrainerConfig:
    return TrainerConfig(
        run=RunConfig(device="cpu"),
        model=ModelConfig(path=path, dtype=dtype, packed_attention=packed),
        data=DataConfig(max_seq_len=SEQ, packing=packing),
        train=TrainConfig(precision=precision, micro_batch_size=micro, global_batch_size=micro),
        peft=PeftConfig(kind=peft, r=8),
        quant=QuantConfig(kind=quant, compute_dtype="bfloat16") if quant != "none" else QuantConfig(),
    )


def build(config: TrainerConfig):
    from ditty.models.adapters import LoraConverter
    from ditty.models.build import build_model
    from ditty.models.recipe_model import with_packed_attention

    model = with_packed_attention(build_model(config.model, device="cpu", quant=config.quant), config)
    if config.peft.kind != "none":
        # As the trainer does on one process: a quantized base's other weights are upcast to fp32.
        model = LoraConverter(config.peft).convert(model)
    return model.train()


CASES = {
    "full fp32": dict(),
    "LoRA fp32": dict(peft="lora"),
    "full, bf16 weights, bf16 autocast": dict(dtype="bfloat16", precision="bf16"),
    "LoRA, bf16 weights, bf16 autocast": dict(dtype="bfloat16", precision="bf16", peft="lora"),
    "full, fp32 weights, bf16 autocast": dict(precision="bf16"),
    "QLoRA (4-bit base), bf16 autocast": dict(dtype="bfloat16", precision="bf16", peft="lora", quant="bnb-4bit"),
}


# Two padded rows for every case; one unpadded row (no mask: k and v kept at their own width) for two.
PARAMS = [(case, 2) for case in CASES] + [("full fp32", 1), ("QLoRA (4-bit base), bf16 autocast", 1)]


@pytest.mark.parametrize("case,micro", PARAMS, ids=lambda v: str(v))
def test_one_layer_saves_what_the_plan_says(llama_dirs, case, micro):
    options = CASES[case]
    ids = torch.randint(0, SIZES["vocab_size"], (micro, SEQ), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(micro, SEQ, dtype=torch.long)
    if micro > 1:
        mask[1, SEQ // 2 :] = 0  # padding: attention takes a mask, and keeps k and v expanded
    measured, planned = {}, {}
    for layers, path in llama_dirs.items():
        config = recipe(path, micro=micro, **options)
        measured[layers] = saved_bytes(build(config), ids, mask, autocast=config.train.precision != "fp32")
        plan = make_plan(config, Target(device="cpu"), with_knobs=False)
        planned[layers] = next(r.bytes for r in plan.memory.kinds[0].rows if r.label.startswith("activations"))
    one_layer = measured[2] - measured[1]
    print(f"{case}, micro {micro}: one layer saves {one_layer} bytes, planned {planned[2] - planned[1]}")
    assert planned[2] - planned[1] == pytest.approx(one_layer, abs=1)
    # The whole forward (a 1-layer model: inputs, embeddings, final norm): within 10 percent.
    assert planned[1] == pytest.approx(measured[1], rel=0.10)


@pytest.mark.parametrize("case", ["full fp32", "LoRA fp32"])
def test_a_packed_row_keeps_what_the_plan_says(llama_dirs, case):
    """Packed samples of a mask-free type attend within each sample (ditty.models.packing's
    per-sample SDPA): no [T, T] mask, k and v at their own width, and, for samples of several
    lengths, the output gathered back into row order with its index, as the plan counts them. Rows this
    short take the dense mask under "auto" (ditty.models.packing.isolation_path), so the recipe names
    the per-sample path."""
    from ditty.models.packing import packed_inputs

    lengths = [8, 10, 6]  # three samples, three SDPA calls, in one row of SEQ tokens
    ids = torch.randint(0, SIZES["vocab_size"], (1, SEQ), generator=torch.Generator().manual_seed(0))
    batch = {
        "input_ids": ids,
        "position_ids": torch.cat([torch.arange(n) for n in lengths])[None],
        "cu_seq_lens_q": torch.tensor([0, 8, 18, 24], dtype=torch.int32),
        "cu_seq_lens_k": torch.tensor([0, 8, 18, 24], dtype=torch.int32),
        "max_length_q": max(lengths),
        "max_length_k": max(lengths),
    }
    measured, planned = {}, {}
    for layers, path in llama_dirs.items():
        config = recipe(path, packing=True, packed="per-sample", **CASES[case])
        model = build(config)
        inputs = packed_inputs(model, batch)
        assert "ditty_packed_sdpa" == model.config._attn_implementation  # the mask-free path, not the dense mask
        mask = inputs.pop("attention_mask")
        measured[layers] = saved_bytes(model, inputs.pop("input_ids"), mask, autocast=False, **inputs)
        plan = make_plan(config, Target(device="cpu"), with_knobs=False)
        planned[layers] = next(r.bytes for r in plan.memory.kinds[0].rows if r.label.startswith("activations"))
    one_layer = measured[2] - measured[1]
    print(f"{case}, packed row: one layer saves {one_layer} bytes, planned {planned[2] - planned[1]}")
    assert planned[2] - planned[1] == pytest.approx(one_layer, abs=1)
