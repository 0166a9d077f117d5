"""supports_packed_attention, and the measurements behind its tables: a packed row gives each
sample's own logits (within 1e-5) with the dense 4D block-diagonal additive mask for every type in
PACKED_MASK_MODEL_TYPES, and without any T x T tensor (ditty's per-sample attention, PACKED_SDPA)
for every type in MASK_FREE_MODEL_TYPES; the other types fall back to the dense mask.
The CUDA kernels (flash_attention_2 varlen, flex_attention) are tested on a GPU (marker `gpu`)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ditty.data.collate import pack_rows
from ditty.models import supports_packed_attention
from ditty.models.packing import MASK_FREE_MODEL_TYPES, PACKED_MASK_MODEL_TYPES, PACKED_SDPA, packed_inputs

LENGTHS = (5, 7, 4)
TINY = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# Kernels each model type has in transformers 5.23 (gemma2 has no sdpa path).
SDPA_MISSING = {"gemma2"}


def block_diagonal_mask(lengths) -> torch.Tensor:
    """[1, 1, T, T] additive float mask, the convention of ditty/data/collate.py."""
    total = sum(lengths)
    allowed = torch.zeros(total, total, dtype=torch.bool)
    start = 0
    for length in lengths:
        allowed[start : start + length, start : start + length] = torch.ones(length, length, dtype=torch.bool).tril()
        start += length
    mask = torch.zeros(total, total).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask[None, None]


def mask_free_error(
    model_type: str, attn_implementation: str, device: str = "cpu", choice: str = "per-sample"
) -> tuple[float, str]:
    """Largest logit difference between ditty's packed batch (two rows: samples of LENGTHS[:2], then
    LENGTHS[2] and a padding tail) through `packed_inputs` (with `choice`, model.packed_attention)
    and the samples run one by one; and the attention implementation the model ended up with."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **TINY)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    model = model.to(device).eval()
    ids = torch.randint(3, 100, (sum(LENGTHS),)).tolist()
    samples, start = [], 0
    for length in LENGTHS:
        samples.append((ids[start : start + length], ids[start : start + length]))
        start += length
    batch = pack_rows([samples[:2], samples[2:] + [([5] * 6, [5] * 6)]], pad_token_id=0)
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    with torch.no_grad():
        packed = model(**packed_inputs(model, batch, choice=choice), use_cache=False).logits
        alone = [model(input_ids=torch.tensor([s], device=device), use_cache=False).logits[0] for s, _ in samples]
    first, second = LENGTHS[0] + LENGTHS[1], LENGTHS[2]
    error = max(
        (packed[0, :first] - torch.cat(alone[:2])).abs().max().item(),
        (packed[1, :second] - alone[2]).abs().max().item(),
    )
    return error, model.config._attn_implementation


def packing_error(model_type: str, attn_implementation: str, *, isolate: bool = True) -> float:
    """Largest logit difference between the packed row and the samples run one by one."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **TINY)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()
    ids = torch.randint(3, 100, (1, sum(LENGTHS)))
    starts = [sum(LENGTHS[:i]) for i in range(len(LENGTHS))]
    position_ids = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    mask = block_diagonal_mask(LENGTHS) if isolate else torch.ones_like(ids)
    with torch.no_grad():
        separate = torch.cat(
            [model(input_ids=ids[:, s : s + n], use_cache=False).logits for s, n in zip(starts, LENGTHS)], 1
        )
        packed = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False).logits
    return (packed - separate).abs().max().item()


def _cases(model_types):
    return [
        (t, impl)
        for t in sorted(model_types)
        for impl in ("sdpa", "eager")
        if not (impl == "sdpa" and t in SDPA_MISSING)
    ]


@pytest.mark.parametrize(("model_type", "attn_implementation"), _cases({"llama", "mistral", "qwen2", "gpt_neox"}))
def test_common_models_isolate_packed_samples(model_type, attn_implementation):
    assert packing_error(model_type, attn_implementation) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "attn_implementation"), _cases(PACKED_MASK_MODEL_TYPES))
def test_every_listed_model_isolates_packed_samples(model_type, attn_implementation):
    assert packing_error(model_type, attn_implementation) < 1e-5


@pytest.mark.parametrize(("model_type", "attn_implementation"), _cases({"llama", "qwen2", "gpt2"}))
def test_common_models_isolate_packed_samples_without_a_mask(model_type, attn_implementation):
    error, kernel = mask_free_error(model_type, attn_implementation)
    assert kernel == PACKED_SDPA and error < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "attn_implementation"), _cases(MASK_FREE_MODEL_TYPES))
def test_every_mask_free_model_isolates_packed_samples_without_a_mask(model_type, attn_implementation):
    error, kernel = mask_free_error(model_type, attn_implementation)
    assert kernel == PACKED_SDPA and error < 1e-5


@pytest.mark.parametrize("choice", ["auto", "dense"])
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_short_rows_take_the_dense_mask_and_stay_isolated(choice, attn_implementation):
    """Rows of up to DENSE_MASK_MAX_WIDTH tokens on the CPU ("auto"), or any row with "dense": the
    block mask, through the model's own kernel (no switch to PACKED_SDPA)."""
    error, kernel = mask_free_error("llama", attn_implementation, choice=choice)
    assert kernel == attn_implementation and error < 1e-5


def test_auto_chooses_by_row_width_device_and_kernel():
    from ditty.models.packing import DENSE_MASK_MAX_WIDTH, isolation_path

    widest = DENSE_MASK_MAX_WIDTH["cpu"]
    assert isolation_path("llama", "sdpa", "cpu", widest) == "dense"
    assert isolation_path("llama", "sdpa", "cpu", widest + 1) == "per-sample"
    assert isolation_path("llama", PACKED_SDPA, "cpu", 64) == "dense"  # a model switched earlier still follows the rule
    assert isolation_path("llama", "sdpa", "cuda", 64) == "per-sample"  # not measured on CUDA: as before
    assert isolation_path("llama", "sdpa", "cpu", 16384, "dense") == "dense"  # the recipe's choice stands
    assert isolation_path("llama", "eager", "cpu", 64, "per-sample") == "per-sample"
    assert isolation_path("llama", "flex_attention", "cpu", 64) == "kernel"
    assert isolation_path("llama", "flash_attention_2", "cuda", 16384, "dense") == "kernel"  # no mask input
    assert isolation_path("gemma2", "eager", "cpu", 16384, "per-sample") == "dense"  # softcapping needs the mask
    assert isolation_path(None, "sdpa", "cpu", 16384) == "dense"


@pytest.mark.parametrize("width", [64, 2048])
@pytest.mark.parametrize("choice", ["auto", "dense", "per-sample"])
def test_the_planner_and_ditty_check_name_the_path_training_takes(tmp_path, width, choice):
    """Settings.packed_attention (the memory plan) and `ditty check`'s line agree with what
    packed_inputs does with a full row of data.max_seq_len tokens of the model the trainer builds."""
    from ditty.config.loader import parse_recipe
    from ditty.models.packing import PATH_DESCRIPTIONS
    from ditty.models.recipe_model import base_model_for
    from ditty.plan import Target, make_plan
    from ditty.recipe.data_rules import packed_attention_text

    sizes = ", ".join(f"{k} = {v}" for k, v in TINY.items() if k != "max_position_embeddings")
    text = (
        f'[run]\ndevice = "cpu"\noutput_dir = "{tmp_path}"\n[model]\narchitecture = "llama"\n'
        f'packed_attention = "{choice}"\nconfig = {{ {sizes}, max_position_embeddings = {width} }}\n'
        f'[tokenizer]\nkind = "byte"\n[data]\npacking = true\nmax_seq_len = {width}\n[train]\nsteps = 1\n'
    )
    config = parse_recipe(text).config
    planned = make_plan(config, Target(device="cpu"), with_knobs=False).settings.packed_attention
    model, _ = base_model_for(config, None, torch.device("cpu"), low_memory=False)
    half = width // 2
    samples = [([3] * half, [3] * half), ([4] * (width - half), [4] * (width - half))]
    inputs = packed_inputs(model, pack_rows([samples], pad_token_id=0))
    mask = inputs.get("attention_mask")
    if model.config._attn_implementation == PACKED_SDPA:
        taken = "per-sample"
        assert mask.dim() == 2
    else:
        taken = "dense"
        assert mask.shape == (1, 1, width, width)
    expected = choice if choice != "auto" else ("dense" if width <= 256 else "per-sample")
    assert planned == taken == expected
    assert PATH_DESCRIPTIONS[taken] in packed_attention_text(config)


@pytest.mark.parametrize("model_type", sorted(PACKED_MASK_MODEL_TYPES - MASK_FREE_MODEL_TYPES))
def test_the_other_models_keep_the_dense_mask_and_stay_isolated(model_type):
    impl = "eager" if model_type in SDPA_MISSING else "sdpa"
    error, kernel = mask_free_error(model_type, impl)
    assert kernel == impl and error < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("attn_implementation", ["flash_attention_2", "flex_attention"])
def test_cuda_kernels_isolate_packed_samples(attn_implementation):
    """flash_attention_2 gets the cumulative lengths (varlen); flex_attention a BlockMask from the
    position ids. Needs CUDA (and the flash-attn package for flash_attention_2)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if attn_implementation == "flash_attention_2":
        pytest.importorskip("flash_attn")
    error, kernel = mask_free_error("llama", attn_implementation, device="cuda")
    assert kernel == attn_implementation and error < 1e-2  # fp32 in, the kernels compute in bf16/tf32


def test_negative_control_an_all_ones_mask_leaks():
    """Without the block mask the same check fails, so the check can see a leak."""
    assert packing_error("llama", "sdpa", isolate=False) > 1e-2


def test_answers_by_model_type_config_and_model():
    assert supports_packed_attention("llama")
    assert not supports_packed_attention("bloom")  # ALiBi: rejects the 4D mask
    config = AutoConfig.for_model("llama", **TINY)
    assert supports_packed_attention(config)
    model = AutoModelForCausalLM.from_config(config)
    assert supports_packed_attention(model)
    assert not supports_packed_attention(torch.nn.Linear(2, 2))  # no config: nothing known


def test_flash_and_flex_kernels_pack_only_mask_free_models():
    """They take no 4D mask: a mask-free type isolates through the cumulative lengths / position ids."""
    for kernel in ("flash_attention_2", "flex_attention"):
        config = AutoConfig.for_model("llama", **TINY)
        config._attn_implementation = kernel
        assert supports_packed_attention(config)
        falcon = AutoConfig.for_model("falcon", **TINY)
        falcon._attn_implementation = kernel
        assert not supports_packed_attention(falcon)


def test_a_sliding_window_shorter_than_the_rows_is_refused():
    windowed = AutoConfig.for_model("mistral", **TINY, sliding_window=256)
    assert supports_packed_attention(windowed, max_seq_len=256)
    assert not supports_packed_attention(windowed, max_seq_len=512)
    unused_window = AutoConfig.for_model("qwen2", **TINY, sliding_window=256, use_sliding_window=False)
    assert supports_packed_attention(unused_window, max_seq_len=512)


def test_auto_packs_through_flex_attention_on_cuda_only():
    """flex_attention on an H100 ran packed rows 9x faster than the per-sample SDPA loop
    (BENCHMARKS.md); on the CPU the loop stays (no compile of the flex kernel)."""
    from ditty.models.packing import packed_kernel

    assert packed_kernel("llama", "auto", "cuda") == "flex_attention"
    assert packed_kernel("llama", "auto", "cpu") is None
    assert packed_kernel("llama", "sdpa", "cuda") is None  # the recipe's own choice stands
    assert packed_kernel("gemma2", "auto", "cuda") is None  # not mask-free: keeps the dense mask
    assert packed_kernel(None, "auto", "cuda") is None  # unknown offline


def test_the_trainer_builds_a_packed_cuda_run_with_flex(tmp_path):
    from ditty.config.loader import parse_recipe
    from ditty.models.recipe_model import with_packed_kernel

    recipe = '[model]\narchitecture = "llama"\n[data]\npacking = {}\n[train]\nsteps = 1\n'
    packed = parse_recipe(recipe.format("true")).config
    assert with_packed_kernel(packed, torch.device("cuda")).model.attn_implementation == "flex_attention"
    assert with_packed_kernel(packed, torch.device("cpu")) is packed
    padded = parse_recipe(recipe.format("false")).config
    assert with_packed_kernel(padded, torch.device("cuda")) is padded


@pytest.mark.parametrize(("kernel", "warned"), [("sdpa", True), ("eager", True), ("auto", False)])
def test_the_compiler_warns_of_the_per_sample_loop_on_cuda(monkeypatch, kernel, warned):
    """A packed recipe that names sdpa/eager on a CUDA machine is told of flex_attention. No GPU here:
    the device probe answers as a CUDA machine's would."""
    from ditty.config.loader import parse_recipe
    from ditty.recipe import compile_recipe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    recipe = f'[model]\narchitecture = "llama"\nattn_implementation = "{kernel}"\n[data]\npacking = true\n'
    plan = compile_recipe(parse_recipe(recipe + "[train]\nsteps = 1\n"))
    hits = [p for p in plan.warnings if p.key == "model.attn_implementation" and "flex_attention" in p.message]
    assert bool(hits) == warned
    on_cpu = compile_recipe(
        parse_recipe(recipe.replace("[model]", '[run]\ndevice = "cpu"\n[model]') + "[train]\nsteps = 1\n")
    )
    assert not [p for p in on_cpu.warnings if p.key == "model.attn_implementation"]


@pytest.mark.parametrize(
    ("model_lines", "warned"),
    [
        ('architecture = "gemma2"\npacked_attention = "per-sample"', True),
        ('architecture = "llama"\nattn_implementation = "flex_attention"\npacked_attention = "dense"', True),
        ('architecture = "llama"\npacked_attention = "per-sample"', False),
    ],
)
def test_the_compiler_warns_of_a_packed_attention_choice_that_cannot_apply(model_lines, warned):
    from ditty.config.loader import parse_recipe
    from ditty.recipe import compile_recipe

    recipe = f'[run]\ndevice = "cpu"\n[model]\n{model_lines}\n[data]\npacking = true\n[train]\nsteps = 1\n'
    plan = compile_recipe(parse_recipe(recipe))
    assert bool([p for p in plan.warnings if p.key == "model.packed_attention"]) == warned
