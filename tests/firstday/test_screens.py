"""Quiet, correct screens: library noise only with --verbose; every command's --help works and names
the launch flags."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from ditty._utils import quiet
from ditty.cli import main

NOISE = ("Failed to load", "_pytree", "Setting accelerator to CPU", "LOAD REPORT")


def test_noisy_loggers_are_filtered_unless_verbose(monkeypatch, caplog):
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    quiet.quiet_libraries()
    with caplog.at_level(logging.INFO):
        logging.getLogger("torchao").warning("Failed to load _C_mxfp8.so")
        logging.getLogger("DeepSpeed").warning("Setting accelerator to CPU.")
        logging.getLogger("torchao").error("a real error")
    assert [r.getMessage() for r in caplog.records] == ["a real error"]
    for name in quiet.NOISY_LOGGERS:  # verbose: the filters come off in a process that asks for them
        logging.getLogger(name).removeFilter(quiet._FILTER)
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    quiet.quiet_libraries()
    assert all(quiet._FILTER not in logging.getLogger(n).filters for n in quiet.NOISY_LOGGERS)
    monkeypatch.delenv(quiet.VERBOSE_ENV)
    quiet.quiet_libraries()


@pytest.mark.slow  # two short runs of the demo recipe in fresh processes (the noise comes at import)
def test_a_run_shows_library_noise_only_with_verbose(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != quiet.VERBOSE_ENV}
    args = [sys.executable, "-m", "ditty", "run", "tiny_sft", "--train.steps", "2", "--data.num_samples", "500"]
    args += ["--train.eval_samples", "4", "--scheduler.warmup_steps", "1", "--logging.progress", "false"]
    plain = subprocess.run([*args, "--run.output_dir", str(tmp_path / "a")], capture_output=True, text=True, env=env)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert not [marker for marker in NOISE if marker in plain.stdout + plain.stderr]
    loud = subprocess.run(
        [*args, "--run.output_dir", str(tmp_path / "b"), "--verbose"], capture_output=True, text=True, env=env
    )
    assert loud.returncode == 0
    try:
        import torchao  # noqa: F401
    except ImportError:
        return
    assert any(marker in loud.stdout + loud.stderr for marker in NOISE)


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
