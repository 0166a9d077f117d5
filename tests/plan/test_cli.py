"""`ditty check RECIPE --plan` and `ditty init --model ... --method ...` on the command line."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ditty.cli import main
from ditty.config.loader import load_any
from ditty.plan import Target, make_plan
from ditty.plan.settings import parse_memory
from ditty.recipe import compile_recipe

ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_check_plan_prints_the_memory_table_and_the_time(capsys):
    code, out, err = run_cli(capsys, "check", "llama3_qlora", "--plan", "--gpu-memory", "16GB")
    assert code == 0, err
    for text in ("memory per rank (GiB)", "4-bit weights", "4-bit quantization state", "logits and loss", "fits:"):
        assert text in out
    assert "time per step" in out and "estimated total" in out
    assert out.rstrip().endswith("warning(s))")  # the plan comes before the verdict line


def test_a_plan_that_does_not_fit_names_the_knobs_that_would(capsys):
    code, out, err = run_cli(capsys, "check", "mistral_lora", "--plan", "--gpu-memory", "16GB")
    assert code == 0, err
    assert "warning: rank 0 needs" in out
    knobs = [line for line in out.splitlines() if line.strip().startswith("with ") and "(fits)" in line]
    assert knobs, out
    assert "quant.kind" in out  # a 4-bit base is the knob that makes a 7B LoRA fit 16 GB


def test_plan_over_several_gpus_and_nodes(capsys):
    code, out, err = run_cli(
        capsys, "check", "llama3_qlora", "--plan", "--gpus", "4", "--nodes", "2", "--gpu-memory", "H100",
        "--parallel.kind", "ddp", "--train.global_batch_size", "16", "--train.micro_batch_size", "2",
    )  # fmt: skip
    assert code == 0, err
    assert "8 GPU(s) (2 nodes x 4)" in out and "ranks 0-7" in out and "NCCL buffers" in out


def test_plan_of_a_cpu_recipe_plans_the_cpu(capsys):
    code, out, err = run_cli(capsys, "check", "tiny_sft", "--plan", "--run.device", "cpu")
    assert code == 0, err
    assert "on the CPU" in out and "interpreter and libraries" in out and "--probe" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gpus", "2"], "--gpus belongs to --plan"),
        (["--plan", "--gpu-memory", "lots"], "neither a size nor a GPU"),
        (["--plan", "--gpus", "0"], "--gpus must be at least 1"),
        (["--plan", "--model.path", "nobody/not-a-model"], "cannot plan 'nobody/not-a-model' offline"),
    ],
)
def test_plan_mistakes_are_user_errors(capsys, args, message):
    code, _, err = run_cli(capsys, "check", "llama3_qlora", *args)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_70b_plan_answers_in_under_5_seconds_without_torch(tmp_path):
    recipe = tmp_path / "llama70b.toml"
    recipe.write_text(
        '[model]\npath = "meta-llama/Meta-Llama-3-70B"\ndtype = "bfloat16"\n'
        '[quant]\nkind = "bnb-4bit"\nstorage_dtype = "bfloat16"\n[peft]\nkind = "lora"\n'
        '[parallel]\nkind = "fsdp"\n[data]\nsource = "hub"\nname = "trl-lib/tldr"\nmax_seq_len = 2048\n'
        '[train]\nsteps = 100\nglobal_batch_size = 16\nmicro_batch_size = 1\nprecision = "bf16"\n'
        'activation_checkpointing = "full"\n'
    )
    code = (
        "import sys; from ditty.cli import main; "
        f"rc = main(['check', {str(recipe)!r}, '--plan', '--gpus', '8', '--gpu-memory', '80GB']); "
        "assert 'torch' not in sys.modules, 'the plan imported torch'; sys.exit(rc)"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.returncode == 0, proc.stderr
    assert "70.6B-parameter llama" in proc.stdout and "ranks 0-7" in proc.stdout
    print(f"ditty check --plan of a 70B recipe: {cpu:.2f} CPU s, {seconds:.2f} wall s (interpreter start included)")
    # The CPU time the command needs: the wall time on a shared machine also counts other jobs' turns.
    assert cpu < 5


# --- ditty init from intent -----------------------------------------------------------------------

SCENARIOS = [
    ("meta-llama/Meta-Llama-3-8B", "lora", 1, "24GB"),
    ("meta-llama/Meta-Llama-3-8B", "qlora", 1, "16GB"),
    ("meta-llama/Meta-Llama-3-70B", "qlora", 2, "80GB"),
    ("meta-llama/Meta-Llama-3-8B", "full", 8, "80GB"),
]


@pytest.mark.parametrize("model,method,gpus,memory", SCENARIOS, ids=lambda v: str(v))
def test_init_from_intent_writes_a_recipe_that_checks_and_fits(capsys, tmp_path, model, method, gpus, memory):
    path = tmp_path / "recipe.toml"
    code, out, err = run_cli(
        capsys, "init", "--model", model, "--method", method, "--gpus", gpus, "--gpu-memory", memory, "-o", path
    )
    assert code == 0, err
    assert f"wrote {path}" in out and "memory per rank" in out
    text = path.read_text()
    assert "# >> chosen by `ditty init`" in text and "# memory per rank (GiB)" in text
    loaded = load_any(str(path))
    for world_size in (1, gpus):  # `ditty check FILE`, and with --nproc-per-node
        compiled = compile_recipe(loaded, world_size=world_size)
        assert not compiled.errors, [p.format() for p in compiled.errors]
    plan = make_plan(loaded.config, Target(gpus_per_node=gpus, memory=parse_memory(memory)), with_knobs=False)
    assert plan.fits
    config = loaded.config
    assert (config.quant.kind == "bnb-4bit") == (method == "qlora")
    assert (config.peft.kind == "lora") == (method != "full")
    assert config.parallel.kind == ("none" if gpus == 1 else config.parallel.kind)
    if method == "full":
        assert config.parallel.kind == "fsdp"  # 8B with AdamW does not fit as a DDP replica of 80 GB
    # The same recipe through `ditty check --plan` on the command line: valid, and it fits.
    code, out, err = run_cli(capsys, "check", path, "--plan", "--gpus", gpus, "--gpu-memory", memory)
    assert code == 0, err
    assert "fits:" in out and "warning: rank" not in out


def test_init_from_intent_reads_the_data_format(capsys, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    code, out, err = run_cli(
        capsys, "init", "--model", "meta-llama/Llama-3.2-1B", "--method", "lora", "--gpu-memory", "24GB",
        "--data", data, "--seq-len", "4096",
    )  # fmt: skip
    assert code == 0, err
    assert f'path = "{data}"' in out and 'format = "chat"' in out and "max_seq_len = 4096" in out


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"conversations": [{"from": "human", "value": "hi"}]}, ['format = "chat"']),
        (
            {"instruction": "Say hi.", "input": "", "output": "hi"},
            ['format = "prompt_completion"', 'template = "alpaca"'],
        ),
    ],
)
def test_init_reads_sharegpt_and_alpaca_files(capsys, tmp_path, row, expected):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(row) + "\n")
    code, out, err = run_cli(
        capsys, "init", "--model", "meta-llama/Llama-3.2-1B", "--method", "lora", "--gpu-memory", "24GB",
        "--data", data,
    )  # fmt: skip
    assert code == 0, err
    assert all(line in out for line in expected), out


def test_init_never_writes_a_recipe_check_would_refuse(capsys, tmp_path):
    path = tmp_path / "recipe.toml"
    code, _, err = run_cli(
        capsys, "init", "--model", "meta-llama/Meta-Llama-3-8B", "--method", "lora", "--gpus", "2",
        "--gpu-memory", "80GB", "--train.global_batch_size", "7", "-o", path,
    )  # fmt: skip
    assert code == 2 and not path.exists()
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--method", "lora", "--gpu-memory", "24GB"], "needs --model"),
        (["--model", "meta-llama/Meta-Llama-3-8B", "--method", "dpo", "--gpu-memory", "24GB"], "not one of"),
        (["--model", "meta-llama/Meta-Llama-3-70B", "--method", "full", "--gpu-memory", "24GB"], "fits 1 GPU"),
    ],
)
def test_init_intent_mistakes_are_user_errors(capsys, args, message):
    code, _, err = run_cli(capsys, "init", *args)
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.slow
def test_probe_measures_real_steps(capsys, tmp_path):
    code, out, err = run_cli(
        capsys, "check", "tiny_sft", "--plan", "--probe", "2", "--run.device", "cpu", "--run.num_threads", "1",
        "--train.eval_every", "0", "--scheduler.warmup_steps", "0",
    )  # fmt: skip
    assert code == 0, err
    assert "probe: 3 steps" in out and "measured:" in out and "estimated total" in out
