"""mfu/hfu: FLOPs per token from a transformer's config (checked against torch's FlopCounterMode),
the peak table and the cached CPU probe, and the entries of a metrics record."""

from __future__ import annotations

import json
import types

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ditty.metrics import mfu as mfu_module
from ditty.metrics import peak
from ditty.metrics.mfu import matmul_parameters, measure_forward_flops, transformer_flops_per_token, utilization

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)


def tiny(model_type: str = "llama", attn_implementation: str = "sdpa", **overrides):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**TINY, **overrides})
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)


def run_config(**logging):
    """The parts of a Trainer.Config that utilization reads."""
    return types.SimpleNamespace(
        train=types.SimpleNamespace(precision="fp32", activation_checkpointing="none"),
        fp8=types.SimpleNamespace(enabled=False),
        logging=types.SimpleNamespace(peak_tflops=logging.get("peak_tflops")),
        data=types.SimpleNamespace(max_seq_len=128),
    )


def test_flops_per_token_is_6n_plus_attention():
    model = tiny()
    embedding = model.get_input_embeddings().weight.numel()
    n = sum(p.numel() for p in model.parameters()) - embedding
    assert matmul_parameters(model, model.config) == (n, n)
    attention = 12 * 2 * 4 * 16 * 128  # layers x heads x head_dim x seq_len
    assert transformer_flops_per_token(model, 128).model == 6 * n + attention
    full = transformer_flops_per_token(model, 128, "full")
    assert full.recompute == 2 * n + attention / 3  # the forward again
    assert transformer_flops_per_token(model, 128, "selective").recompute == 0


def test_tied_head_counts_its_matrix_once_and_a_frozen_base_costs_four_of_six():
    tied = tiny(tie_word_embeddings=True)
    n = sum(p.numel() for p in tied.parameters())  # the shared matrix is the head's product
    assert matmul_parameters(tied, tied.config)[0] == n
    for p in tied.parameters():
        p.requires_grad_(False)
    assert transformer_flops_per_token(tied, 128).model == 4 * n + 12 * 2 * 4 * 16 * 128


def test_experts_count_at_top_k_over_experts():
    model = tiny("mixtral", num_local_experts=4, num_experts_per_tok=2)
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    embedding = model.get_input_embeddings().weight.numel()
    dense = sum(p.numel() for p in model.parameters()) - embedding - experts
    assert matmul_parameters(model, model.config)[0] == dense + experts // 2


def test_the_formula_agrees_with_torch_flop_counter():
    """A training forward and backward of a tiny Llama counted op by op, against the formula (eager
    attention: the counter does not count the CPU's fused SDPA kernel)."""
    from torch.utils.flop_counter import FlopCounterMode

    model, seq = tiny(attn_implementation="eager"), 128
    ids = torch.randint(0, 512, (2, seq))
    counter = FlopCounterMode(display=False)
    with counter:
        model(input_ids=ids, use_cache=False).logits.float().sum().backward()
    counted = counter.get_total_flops() / ids.numel()
    estimated = transformer_flops_per_token(model, seq).model
    assert 0.9 < estimated / counted < 1.1, (estimated, counted)


def test_the_peak_table_by_device_name_and_dtype():
    assert peak.table_peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak.table_peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.5
    assert peak.table_peak_tflops("NVIDIA H200", "fp8") == 1978.9
    assert peak.table_peak_tflops("NVIDIA A100-SXM4-80GB", "bf16") == 312.0
    assert peak.table_peak_tflops("NVIDIA A10G", "bf16") == 70.0
    assert peak.table_peak_tflops("NVIDIA L4", "fp32") == 30.3
    assert peak.table_peak_tflops("Some Future GPU", "bf16") is None
    assert peak.compute_dtype("fp32", tf32=True) == "tf32" and peak.compute_dtype("bf16", fp8=True) == "fp8"


def test_the_cpu_probe_is_cached_per_machine_and_keeps_the_best_reading(tmp_path, monkeypatch):
    real = peak.probe_cpu_flops(1, size=256, repeats=2)
    assert 1e8 < real < 1e13  # a real product, in GFLOP/s to TFLOP/s
    monkeypatch.setenv("DITTY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak, "_PROBED", {})
    monkeypatch.setattr(peak, "probe_cpu_flops", lambda threads: 5e10)
    assert peak.cpu_peak_flops(threads=2) == 5e10
    ((key, value),) = json.loads((tmp_path / "peak_flops.json").read_text()).items()
    assert "threads=2" in key and value == 5e10
    monkeypatch.setattr(peak, "_PROBED", {})  # a later process reads lower (a busy machine) ...
    monkeypatch.setattr(peak, "probe_cpu_flops", lambda threads: 2e10)
    assert peak.cpu_peak_flops(threads=2) == 5e10  # ... the machine's best reading stays


def test_utilization_entries(monkeypatch):
    model = tiny()
    per_token = transformer_flops_per_token(model, 128).model
    out = utilization(model, run_config(peak_tflops=1.0), "cpu", 2, tokens_per_s=1000.0)
    expected = float(f"{per_token * 1000 / 2e12:.4g}")
    assert out == {"mfu": expected, "hfu": expected}
    assert utilization(model, run_config(), "cpu", 1, tokens_per_s=None) == {"mfu": None, "hfu": None}


def test_a_custom_model_is_measured_on_its_first_training_forward():
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    assert utilization(net, run_config(peak_tflops=1.0), "cpu", 1, 100.0) == {"mfu": None, "hfu": None}
    with measure_forward_flops(net, samples=4):
        net(torch.randn(4, 32))
    per_sample = 3 * 2 * (32 * 64 + 64 * 8)
    assert mfu_module._MEASURED[net] == per_sample
    assert utilization(net, run_config(peak_tflops=1.0), "cpu", 1, 100.0)["mfu"] == float(
        f"{per_sample * 100 / 1e12:.4g}"
    )


@pytest.mark.gpu
def test_a_known_gpu_has_a_peak():
    name = torch.cuda.get_device_name()
    assert peak.table_peak_tflops(name, "bf16") is not None, f"{name} is missing from PEAK_TFLOPS"
    assert peak.device_peak_flops("cuda", "bf16") > 1e13


def test_the_progress_line_shows_mfu():
    from ditty.metrics import Progress

    progress = Progress(10)
    progress.set_metrics({"loss": 1.0, "tokens_per_s": 100.0, "mfu": 0.1234})
    assert "mfu=12.3%" in str(progress.bar.postfix)
    progress.close()


def test_the_probe_leaves_the_global_rng_alone():
    """A resumed run probes again: drawing from the global RNG would change its dropout stream."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    peak.probe_cpu_flops(1, size=64, repeats=1)
    assert torch.equal(torch.rand(3), expected)
