"""Quiet, correct screens: library noise only with --verbose; every command's --help works and names
the launch flags."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ditty._utils import quiet
from ditty.cli import main

NOISE = (
    "Failed to load",  # torchao's optional kernels; bitsandbytes' "Failed to load CPU gemm_4bit_forward"
    "_pytree",
    "Setting accelerator to CPU",
    "LOAD REPORT",
    "Loading weights",
    "Writing model shards",
    "FutureWarning",
    "has no place for",
)
API_RUN = """
import os
import sys

import torch

from ditty import ModelFactory, PeftConfig, Pipeline

ids = torch.arange(3, 35)
samples = [{"input_ids": ids.roll(i), "labels": ids.roll(i)} for i in range(8)]
factory = ModelFactory.from_huggingface(
    sys.argv[1], peft_config=PeftConfig(enabled=True, r=4, lora_alpha=8, target_modules=["q_proj"])
)
for output_dir in sys.argv[2:]:
    Pipeline(
        model_factory=factory, dataset=samples, output_dir=output_dir, max_steps=2, batch_size=4, lr=1e-3,
        log_every=1, progress=False,
    ).run()
    print("=== verbose from here ===", file=sys.stderr, flush=True)
    os.environ["DITTY_VERBOSE"] = "1"  # the second run, in the same process, asks for the noise
"""


def test_noisy_loggers_are_filtered_unless_verbose(monkeypatch, caplog):
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    quiet.quiet_libraries()
    with caplog.at_level(logging.INFO):
        logging.getLogger("torchao").warning("Failed to load _C_mxfp8.so")
        logging.getLogger("DeepSpeed").warning("Setting accelerator to CPU.")
        # Said only on CPUs with AVX-512 BF16 (not this one), when bitsandbytes is imported.
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'"
        )
        logging.getLogger("torchao").error("a real error")
    assert [r.getMessage() for r in caplog.records] == ["a real error"]
    for name in quiet.NOISY_LOGGERS:  # verbose: the filters come off in a process that asks for them
        logging.getLogger(name).removeFilter(quiet._FILTER)
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    quiet.quiet_libraries()
    assert all(quiet._FILTER not in logging.getLogger(n).filters for n in quiet.NOISY_LOGGERS)
    monkeypatch.delenv(quiet.VERBOSE_ENV)
    quiet.quiet_libraries()


@pytest.mark.slow  # short runs of the demo recipes in fresh processes (the noise comes at import)
def test_a_run_shows_library_noise_only_with_verbose(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != quiet.VERBOSE_ENV}
    args = [sys.executable, "-m", "ditty", "run", "tiny_sft", "--train.steps", "2", "--data.num_samples", "500"]
    args += ["--train.eval_samples", "4", "--scheduler.warmup_steps", "1", "--logging.progress", "false"]
    plain = subprocess.run([*args, "--run.output_dir", str(tmp_path / "a")], capture_output=True, text=True, env=env)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert not [marker for marker in NOISE if marker in plain.stdout + plain.stderr]
    grpo = [sys.executable, "-m", "ditty", "run", "tiny_grpo", "--model.path", str(tmp_path / "a" / "final")]
    grpo += [
        "--train.steps",
        "2",
        "--data.num_samples",
        "200",
        "--train.eval_samples",
        "4",
        "--scheduler.warmup_steps",
        "1",
    ]
    grpo += ["--train.global_batch_size", "16", "--train.micro_batch_size", "16", "--logging.progress", "false"]
    rl = subprocess.run([*grpo, "--run.output_dir", str(tmp_path / "rl")], capture_output=True, text=True, env=env)
    assert rl.returncode == 0, rl.stderr[-2000:]
    assert not [marker for marker in NOISE if marker in rl.stdout + rl.stderr], rl.stderr[-3000:]
    loud = subprocess.run(
        [*args, "--run.output_dir", str(tmp_path / "b"), "--verbose"], capture_output=True, text=True, env=env
    )
    assert loud.returncode == 0
    try:
        import torchao  # noqa: F401
    except ImportError:
        return
    assert any(marker in loud.stdout + loud.stderr for marker in NOISE)


@pytest.mark.slow  # a fresh process: torchao and peft print at import, which an in-process run has done already
def test_a_python_api_run_shows_library_noise_only_with_verbose(tmp_path, tiny_llama_dir):
    """The issue's Python API run: a pretrained model with LoRA through ditty.Pipeline. Quiet, it
    prints none of the libraries' noise; with DITTY_VERBOSE=1 the same run shows it."""
    script = tmp_path / "api_run.py"
    script.write_text(API_RUN)
    env = {k: v for k, v in os.environ.items() if k != quiet.VERBOSE_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    runs = [sys.executable, str(script), tiny_llama_dir, str(tmp_path / "quiet"), str(tmp_path / "verbose")]
    done = subprocess.run(runs, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    plain, loud = done.stderr.split("=== verbose from here ===")[:2]
    assert not [marker for marker in NOISE if marker in plain], plain[-3000:]  # import time included
    assert "Loading weights" in loud and "FutureWarning" in loud, loud[-3000:]  # the same calls, verbose


def test_help_names_the_launch_flags(capsys):
    assert main(["--help"]) == 0
    assert "--nproc-per-node" in capsys.readouterr().out
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--nproc-per-node N" in out and "--rdzv-endpoint" in out and "--verbose" in out


@pytest.mark.parametrize("command", ["generate", "export", "push", "plot", "eval", "ls"])
def test_every_command_has_help(capsys, command):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: ditty {command}")
