"""The fault-injection suite's tools: a tiny recipe, runs through the real command line, and the
faults themselves (overwrite, truncate, delete), plus `record`, which feeds RELIABILITY.md.

Runs go through `ditty.cli.main` in this process where that is enough (exit code, messages, files:
the same code path as the `ditty` command, without paying the interpreter start each time), and
through real subprocesses where the fault needs one (kill -9, signals, two processes at once).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RECIPE = """
[run]
name = "reliability"
output_dir = "{out}"
seed = 0
device = "cpu"

[model]
init = "random"
architecture = "llama"
config = {{ hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2, num_attention_heads = 4, \
num_key_value_heads = 2, max_position_embeddings = 64, tie_word_embeddings = false, attention_dropout = 0.1 }}

[tokenizer]
kind = "byte"

[data]
source = "builtin"
name = "addition"
format = "prompt_completion"
max_seq_len = 32
num_samples = 240
val_fraction = 0.05

[train]
steps = {steps}
global_batch_size = 8
micro_batch_size = 4
log_every = 1
eval_every = 0
eval_samples = 0

[optimizer]
kind = "adamw"
lr = 3e-3

[scheduler]
kind = "cosine"
warmup_steps = 2

[checkpoint]
every = 2
keep_last = 3

[logging]
progress = false
{extra}
"""


def write_recipe(
    tmp_path: Path, *, steps: int = 8, out: str = "run", name: str = "recipe.toml", extra: str = ""
) -> Path:
    path = tmp_path / name
    path.write_text(RECIPE.format(out=tmp_path / out, steps=steps, extra=extra))
    return path


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def ditty(*args: str) -> Result:
    """`ditty ARGS` in this process (the command line's own entry point); a traceback that escapes
    it is returned as exit code 1 with the traceback in `err`, as the shell would show it."""
    import traceback

    from ditty.cli import main

    out, err = io.StringIO(), io.StringIO()
    # Warnings reach the terminal through logging's last-resort handler in the real command; under
    # pytest logging has handlers of its own, so one that writes to this run's stderr is added.
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 1
            except Exception:  # noqa: BLE001 - what a user would see: a traceback and exit code 1
                traceback.print_exc()
                code = 1
    finally:
        logging.getLogger().removeHandler(handler)
    return Result(code, out.getvalue(), err.getvalue())


def ditty_process(*args: str, env: dict | None = None, timeout: int = 300, wait: bool = True):
    """`python -m ditty ARGS` in a fresh process: a CompletedProcess, or the Popen when not `wait`."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DITTY_TEST_")}
    full_env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **(env or {}))
    command = [sys.executable, "-m", "ditty", *args]
    if not wait:
        return subprocess.Popen(
            command, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


def losses(run_dir: Path) -> list[tuple[int, float]]:
    from ditty.metrics.logger import read_metrics

    return [(r["step"], r["loss"]) for r in read_metrics(str(run_dir)) if "loss" in r]


def complete_steps(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir() if p.name.startswith("step-") and (p / "COMPLETE").exists())


def shard(run_dir: Path, step: int) -> Path:
    return next((run_dir / "checkpoints" / f"step-{step}").glob("__0_*.distcp"))


def overwrite(path: Path, offset: int, count: int = 4096) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\xff" * count)


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)


def no_traceback(result) -> bool:
    text = result.text if isinstance(result, Result) else (result.stdout + result.stderr)
    return "Traceback (most recent call last)" not in text


def all_finite_weights(model_dir: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    return all(torch.isfinite(t).all() for t in load_file(str(model_dir / "model.safetensors")).values())


def final_weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final" / "model.safetensors"))


def same_weights(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


RECORD_ENV = "DITTY_RELIABILITY_RECORD"


def write_record(record: dict) -> None:
    """Append one trial to $DITTY_RELIABILITY_RECORD (a JSON lines file) when it is set."""
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
