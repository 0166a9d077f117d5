"""The parallel pieces that need no process group: block discovery, policies, launcher plumbing,
meta-device build and loading on one process."""

from __future__ import annotations

import os
import types
import warnings

import pytest
import torch
from torch import nn

from ditty._utils.dist import ERROR_DIR_ENV, record_failure, record_user_error
from ditty.config.errors import RecipeError
from ditty.config.sections import ParallelConfig
from ditty.parallel.accumulation import grad_average_correction, no_sync_context
from ditty.parallel.env import init_distributed
from ditty.parallel.launch import _report, torchrun_args
from ditty.parallel.materialize import load_sharded_from_rank0, load_sharded_from_safetensors, materialize, meta_init
from ditty.parallel.wrap import (
    CPU_OFFLOAD_WARNING,
    CPU_PIN_WARNING,
    apply_parallelism,
    find_blocks,
    mixed_precision_policy,
    offload_policy,
)
from tests.parallel.harness import TinyBlock, TinyNet

# --- wrap ----------------------------------------------------------------------------------------


def test_blocks_from_no_split_modules_names_or_classes():
    model = TinyNet(depth=3)
    assert find_blocks(model) == list(model.blocks)
    assert find_blocks(model, names=["Linear"]) == [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert find_blocks(model, classes=[TinyBlock]) == list(model.blocks)


def test_unknown_block_class_suggests_a_close_name():
    with pytest.raises(RecipeError) as caught:
        find_blocks(TinyNet(), names=["TinyBlok"])
    problem = caught.value.problems[0]
    assert problem.key == "parallel.block_classes" and "did you mean TinyBlock?" in problem.fix


def test_a_model_without_blocks_asks_for_block_classes():
    with pytest.raises(RecipeError, match="declares no blocks"):
        find_blocks(nn.Sequential(nn.Linear(2, 2)))


def test_mixed_precision_defaults_from_train_precision():
    fp32 = mixed_precision_policy(ParallelConfig(kind="fsdp"), "fp32")
    assert (fp32.param_dtype, fp32.reduce_dtype, fp32.output_dtype) == (None, None, None)
    bf16 = mixed_precision_policy(ParallelConfig(kind="fsdp"), "bf16")
    assert (bf16.param_dtype, bf16.reduce_dtype, bf16.cast_forward_inputs) == (torch.bfloat16, torch.float32, True)
    explicit = mixed_precision_policy(
        ParallelConfig(
            kind="fsdp",
            param_dtype="float16",
            reduce_dtype="bfloat16",
            output_dtype="float32",
            cast_forward_inputs=False,
        ),
        "bf16",
    )
    assert (explicit.param_dtype, explicit.reduce_dtype, explicit.output_dtype, explicit.cast_forward_inputs) == (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        False,
    )


def test_cpu_offload_on_a_cpu_device_warns_and_never_pins():
    from torch.distributed.fsdp import CPUOffloadPolicy

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = offload_policy(ParallelConfig(kind="fsdp", cpu_offload=True, pin_memory=True), "cpu")
    assert isinstance(policy, CPUOffloadPolicy) and policy.pin_memory is False
    assert [str(w.message) for w in caught] == [CPU_OFFLOAD_WARNING, CPU_PIN_WARNING]
    assert offload_policy(ParallelConfig(kind="fsdp", cpu_offload=True, pin_memory=True), "cuda").pin_memory
    assert not isinstance(offload_policy(ParallelConfig(kind="fsdp"), "cpu"), CPUOffloadPolicy)


def test_one_process_or_no_mesh_leaves_the_model_alone():
    model = TinyNet()
    for kind in ("none", "ddp", "fsdp", "deepspeed"):
        assert apply_parallelism(model, ParallelConfig(kind=kind), None) is model


# --- accumulation --------------------------------------------------------------------------------


def test_grad_average_correction_is_the_data_parallel_size():
    assert grad_average_correction(1) == 1.0 and grad_average_correction(4) == 4.0
    with pytest.raises(ValueError):
        grad_average_correction(0)


def test_no_sync_context_is_a_no_op_on_a_plain_module():
    model = TinyNet()
    with no_sync_context(model, is_last_micro_batch=False):
        model(torch.randn(2, 8)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


# --- env and launch ------------------------------------------------------------------------------


def test_init_distributed_on_one_process_creates_no_group(monkeypatch):
    import torch.distributed as dist

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = init_distributed("cpu")
    assert (info.rank, info.world_size, info.local_rank, info.device) == (0, 1, 0, torch.device("cpu"))
    assert not info.is_distributed and not dist.is_initialized()


def test_torchrun_arguments():
    one = torchrun_args(["run", "r.toml"], nproc_per_node=2)
    assert one == [
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.5",
        "--standalone",
        "-m",
        "ditty",
        "run",
        "r.toml",
    ]
    many = torchrun_args(
        ["run", "r.toml"],
        nproc_per_node=4,
        nnodes=2,
        node_rank=1,
        rdzv_endpoint="h:29400",
        run_id="job7",
        rdzv_timeout_s=30,
    )
    assert many[6:] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "h:29400",
        "--rdzv-id",
        "job7",
        "--rdzv-conf",
        "join_timeout=30",
        "-m",
        "ditty",
        "run",
        "r.toml",
    ]
    with pytest.raises(RecipeError, match="--rdzv-endpoint"):
        torchrun_args(["run"], nproc_per_node=1, nnodes=2)


def _failure(codes):
    failures = {rank: types.SimpleNamespace(exitcode=code) for rank, code in codes.items()}
    first = min(failures)
    return types.SimpleNamespace(failures=failures, get_first_failure=lambda: (first, failures[first]))


def test_report_without_records_lists_the_failed_ranks(tmp_path, capsys):
    assert _report(_failure({0: 1, 1: -15}), str(tmp_path)) == 1
    assert "rank 0 (exit code 1), rank 1 (exit code -15) failed" in capsys.readouterr().err
    assert _report(_failure({0: -15, 1: 2}), str(tmp_path)) == 2  # exited 2 but left no message
    assert "rank 1 stopped on a user error" in capsys.readouterr().err


def test_report_names_the_rank_that_failed_first(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ERROR_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    record_failure(RuntimeError("broke first\nsecond line"))
    stamp, summary = (tmp_path / "failure-1.txt").read_text().split("\n")
    assert int(stamp) > 0 and summary == "RuntimeError: broke first"
    (tmp_path / "failure-0.txt").write_text(f"{int(stamp) + 1}\nRuntimeError: Connection closed by peer")
    assert _report(_failure({0: 1, 1: 1}), str(tmp_path)) == 1
    assert "error: rank 1 failed first: RuntimeError: broke first" in capsys.readouterr().err


def test_report_prints_a_recorded_user_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ERROR_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    record_user_error("error: `data.path` is missing")
    assert _report(_failure({1: 2}), str(tmp_path)) == 2
    assert capsys.readouterr().err == "error: `data.path` is missing\n"


def test_record_user_error_is_a_no_op_outside_the_launcher(monkeypatch, tmp_path):
    monkeypatch.delenv(ERROR_DIR_ENV, raising=False)
    record_user_error("nothing happens")
    assert not os.listdir(tmp_path)


# --- meta build and loading, one process ----------------------------------------------------------


def test_meta_init_puts_parameters_on_meta_and_keeps_buffers(tiny_llama_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    with meta_init():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_llama_dir))
    assert all(p.is_meta for p in model.parameters())
    buffers = dict(model.named_buffers())
    assert buffers and not any(b.is_meta for b in buffers.values())
    inv_freq = {n: b.clone() for n, b in buffers.items()}
    load_sharded_from_safetensors(model, tiny_llama_dir)
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    for name, value in inv_freq.items():
        assert torch.equal(dict(model.named_buffers())[name], value)  # kept through materialize


def test_load_from_an_in_memory_state_dict():
    source = TinyNet()
    with meta_init():
        model = TinyNet()
    load_sharded_from_rank0(model, source.state_dict())
    for name, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], value)


def test_a_checkpoint_missing_weights_is_a_recipe_error(tmp_path):
    from safetensors.torch import save_file

    state = {k: v for k, v in TinyNet().state_dict().items() if not k.startswith("out.")}
    save_file(state, str(tmp_path / "model.safetensors"))
    with meta_init():
        model = TinyNet()
    with pytest.raises(RecipeError, match="no weights for out.weight, out.bias"):
        load_sharded_from_safetensors(model, str(tmp_path))
    with pytest.raises(RecipeError, match="no model.safetensors"):
        load_sharded_from_safetensors(TinyNet(), str(tmp_path / "nowhere"))


def test_materialize_refuses_lost_non_persistent_buffers():
    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("freq", torch.ones(2), persistent=False)

    with torch.device("meta"):
        model = WithBuffer()
    with pytest.raises(ValueError, match="meta_init"):
        materialize(model, "cpu")
