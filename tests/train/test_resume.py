"""Checkpoints and resume through the real command line: kill a run, run it again, compare losses.

A run that is killed or signalled is a real process of its own, forked from a server that imported
torch and ditty once (tests/train/forked.py); a run that starts several processes, or is killed
inside the checkpoint writer (whose hook is installed at import), is a `python -m ditty run RECIPE`
subprocess; the others call the same entry point (`ditty.cli.main`) in this process. That saves an
interpreter start (about 10 s of CPU) per run and changes no arithmetic: a model this small trains
on one torch thread in each, and a run killed in one process and resumed in another must still
give an uninterrupted run's losses bitwise. A test-only preprocessor
(`tests.train.resume_hooks:SignalAt`) signals its own process at a chosen step and micro-step, so
kills are deterministic; `DITTY_TEST_KILL_IN_SAVE` kills a run inside the checkpoint writer.
The recipe has dropout on, a cosine schedule with warmup and 2 accumulation steps, and logs every
step: metrics.jsonl of a killed-and-resumed run must equal an uninterrupted run's, bitwise (fp32 CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

RECIPE = """
[run]
name = "resume"
output_dir = "{out}"
seed = 0
device = "cpu"

[model]
{model}

[tokenizer]
kind = "byte"

[data]
source = "builtin"
name = "addition"
format = "prompt_completion"
max_seq_len = 32
num_samples = 400
val_fraction = 0.05

[train]
steps = 12
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
warmup_steps = 3

[checkpoint]
every = 4

[peft]
{peft}

[logging]
progress = false

[[pipeline.preprocessors]]
use = "tests.train.resume_hooks:SignalAt"
"""
RANDOM_LLAMA = (
    'init = "random"\narchitecture = "llama"\nconfig = { hidden_size = 32, intermediate_size = 64, '
    "num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, "
    "max_position_embeddings = 64, tie_word_embeddings = false, attention_dropout = 0.1 }"
)


def write_recipe(
    tmp_path: Path,
    name: str = "recipe.toml",
    *,
    out: str = "run",
    model: str = RANDOM_LLAMA,
    peft: str = 'kind = "none"',
) -> Path:
    path = tmp_path / name
    path.write_text(RECIPE.format(out=tmp_path / out, model=model, peft=peft))
    return path


def ditty(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`ditty ARGS`: in this process, or in a forked process when a fault is injected (`env`), or in
    a `python -m ditty` subprocess when the run is distributed or killed inside the writer. A forked
    run's stdout and stderr are one log: both fields hold all of it."""
    distributed = any(arg in ("--nproc-per-node", "--parallel.kind") for arg in args)
    if env is None and not distributed:
        from tests.reliability.helpers import ditty as ditty_in_process

        result = ditty_in_process(*args)
        return subprocess.CompletedProcess(["ditty", *args], result.code, result.out, result.err)
    if env is not None and not distributed and "DITTY_TEST_KILL_IN_SAVE" not in env:
        import tempfile

        from tests.train import forked

        with tempfile.TemporaryDirectory(prefix="ditty-forked-") as folder:
            log = Path(folder) / "run.log"
            code, _, _ = forked.run(list(args), log, env=env)
            text = log.read_text() if log.exists() else ""
        return subprocess.CompletedProcess(["ditty", *args], code, text, text)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DITTY_TEST_")}
    full_env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "ditty", *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def losses(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def complete_steps(run_dir: Path) -> list[str]:
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step-") and (p / "COMPLETE").exists())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, list]:
    """An uninterrupted run of the recipe."""
    tmp = tmp_path_factory.mktemp("reference")
    recipe = write_recipe(tmp)
    proc = ditty("run", str(recipe))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run", losses(tmp / "run")


def test_reference_has_checkpoints_and_the_right_contents(reference):
    run, ref = reference
    assert [s for s, _ in ref] == list(range(1, 13))
    # every = 4 and the end; keep_last = 2 pruned step-4
    assert complete_steps(run) == ["step-12", "step-8"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-12"
    side = json.loads((run / "checkpoints" / "step-8" / "ditty_state.json").read_text())
    assert side["step"] == 8 and side["train_state"]["step"] == 8
    assert side["data"]["cursor"] == 64 and side["scheduler"]["last_epoch"] == 8
    assert side["recipe"]["optimizer.lr"] == 3e-3 and "[optimizer]" in side["recipe_toml"]
    assert side["total_steps"] == 12 and "0" in side["rng"]


def test_sigkill_mid_accumulation_resumes_with_bitwise_equal_losses(tmp_path, reference):
    _, ref = reference
    recipe = write_recipe(tmp_path)
    # 0-based step 6 = the 7th step, its second micro-batch: past step-4, before step-8.
    killed = ditty("run", str(recipe), env={"DITTY_TEST_SIGNAL_AT": "6:1:KILL"})
    assert killed.returncode == -9 or killed.returncode == 137, killed.stderr[-2000:]
    assert complete_steps(tmp_path / "run") == ["step-4"]
    assert [s for s, _ in losses(tmp_path / "run")] == list(range(1, 7))

    resumed = ditty("run", str(recipe))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 4" in resumed.stdout
    assert losses(tmp_path / "run") == ref  # bitwise: dropout, LR schedule, data order and optimizer all carried


def test_a_kill_inside_the_checkpoint_writer_resumes_from_the_previous_checkpoint(tmp_path, reference):
    _, ref = reference
    recipe = write_recipe(tmp_path)
    # The second save (step 8) dies after writing its shards, before .metadata and COMPLETE.
    killed = ditty("run", str(recipe), env={"DITTY_TEST_KILL_IN_SAVE": "2"})
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    root = tmp_path / "run" / "checkpoints"
    assert complete_steps(tmp_path / "run") == ["step-4"]
    assert (root / ".tmp-step-8").is_dir() and not (root / "step-8").exists()
    assert (root / "latest").read_text().strip() == "step-4"

    resumed = ditty("run", str(recipe))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 4" in resumed.stdout
    assert losses(tmp_path / "run") == ref
    assert complete_steps(tmp_path / "run") == ["step-12", "step-8"] and not (root / ".tmp-step-8").exists()


@pytest.mark.parametrize("async_save", ["false", "true"])
def test_sigterm_finishes_the_step_saves_and_the_resumed_losses_are_equal(tmp_path, reference, async_save):
    _, ref = reference
    recipe = write_recipe(tmp_path)
    stopped = ditty("run", str(recipe), "--checkpoint.async_save", async_save, env={"DITTY_TEST_SIGNAL_AT": "5:0:TERM"})
    assert stopped.returncode == 128 + 15, stopped.stderr[-2000:]
    assert "stopped by SIGTERM after step 6" in stopped.stdout and "ditty run <same recipe>" in stopped.stdout
    assert "step-6" in complete_steps(tmp_path / "run")
    assert not (tmp_path / "run" / "final").exists()

    resumed = ditty("run", str(recipe), "--checkpoint.async_save", async_save)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 6" in resumed.stdout
    assert losses(tmp_path / "run") == ref


def test_adapter_run_resumes_exactly(tmp_path, tiny_llama_dir):
    model = f'path = "{tiny_llama_dir}"'
    peft = 'kind = "lora"\nr = 4\nalpha = 8\ndropout = 0.1\ntarget_modules = ["q_proj", "v_proj"]'
    ref_recipe = write_recipe(tmp_path, "ref.toml", out="ref", model=model, peft=peft)
    proc = ditty("run", str(ref_recipe))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = losses(tmp_path / "ref")

    recipe = write_recipe(tmp_path, model=model, peft=peft)
    killed = ditty("run", str(recipe), env={"DITTY_TEST_SIGNAL_AT": "9:0:KILL"})
    assert killed.returncode in (-9, 137)
    # Only the adapter (and its optimizer state) is in the checkpoint.
    from ditty.checkpoint.safe_reader import read_tensor_metadata

    keys = read_tensor_metadata(tmp_path / "run" / "checkpoints" / "step-8" / ".metadata").state_dict_metadata
    weights = [k for k in keys if ".model." in f".{k}" or k.startswith("train.model")]
    assert weights and all("lora_" in k for k in weights), weights[:5]

    resumed = ditty("run", str(recipe))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 8" in resumed.stdout
    assert losses(tmp_path / "run") == ref


def test_policy_finished_never_mismatch_and_more_steps(tmp_path, reference):
    import shutil

    run, ref = reference
    work = tmp_path / "run"
    shutil.copytree(run, work)
    recipe = write_recipe(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in work.rglob("*")}

    finished = ditty("run", str(recipe))
    assert finished.returncode == 0 and "is a finished run" in finished.stdout, finished.stderr[-2000:]
    never = ditty("run", str(recipe), "--checkpoint.resume", "never")
    assert never.returncode == 2 and "already holds a run" in never.stderr and "Traceback" not in never.stderr
    differs = ditty(
        "run",
        str(recipe),
        "--optimizer.lr",
        "1e-3",
        "--data.max_seq_len",
        "48",
        "--train.log_every",
        "2",
        "--checkpoint.every",
        "3",
        "--train.steps",
        "14",
    )
    assert differs.returncode == 2, differs.stderr[-2000:]
    assert "optimizer.lr: 0.003 -> 0.001" in differs.stderr and "data.max_seq_len: 32 -> 48" in differs.stderr
    for ignored in ("train.log_every", "checkpoint.every", "train.steps", "run.output_dir"):
        assert ignored not in differs.stderr.split("fix:")[0]
    assert "force_resume" in differs.stderr
    assert {p: p.stat().st_mtime_ns for p in work.rglob("*")} == before  # nothing touched

    refused = ditty("run", str(recipe), "--train.steps", "14")  # it would replace final/: asked for in so many words
    assert refused.returncode == 2 and "holds a finished run" in refused.stderr
    longer = ditty("run", str(recipe), "--train.steps", "14", "--checkpoint.overwrite_finished", "true")
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "resumed from step 12" in longer.stdout
    got = losses(work)
    assert got[:12] == ref and [s for s, _ in got] == list(range(1, 15))
    assert "step-14" in complete_steps(work)

    forced = ditty(
        "run",
        str(recipe),
        "--train.steps",
        "15",
        "--optimizer.lr",
        "1e-3",
        "--checkpoint.force_resume",
        "true",
        "--checkpoint.overwrite_finished",
        "true",
    )
    assert forced.returncode == 0 and "resumed from step 14" in forced.stdout, forced.stderr[-3000:]


def test_export_gives_the_trained_models_logits(tmp_path, reference):
    import torch
    from transformers import AutoModelForCausalLM

    run, _ = reference
    out = tmp_path / "exported"
    proc = ditty("export", str(run), "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert (out / "tokenizer_config.json").is_file()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    final = AutoModelForCausalLM.from_pretrained(run / "final").eval()
    ids = torch.tensor([[1, 40, 41, 42, 43, 44]])
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, final(ids).logits)

    again = ditty("export", str(run), "-o", str(out))
    assert again.returncode == 2 and "never overwrites" in again.stderr
    merge = ditty("export", str(run), "-o", str(tmp_path / "m"), "--merge-lora")
    assert merge.returncode == 2 and "no adapter" in merge.stderr


def test_export_never_unpickles(tmp_path, reference, forbid_unpickling):
    from ditty.cli.export import export

    forbid_unpickling()
    run, _ = reference
    out = export(run / "checkpoints" / "step-8", tmp_path / "e")
    assert (Path(out) / "model.safetensors").is_file()


@pytest.mark.slow
def test_export_of_an_adapter_checkpoint_and_merged(tmp_path, tiny_llama_dir):
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    model = f'path = "{tiny_llama_dir}"'
    peft = 'kind = "lora"\nr = 4\nalpha = 8\ndropout = 0.0\ntarget_modules = ["q_proj", "v_proj"]'
    recipe = write_recipe(tmp_path, model=model, peft=peft)
    proc = ditty("run", str(recipe), "--train.steps", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    assert ditty("export", str(run / "checkpoints" / "step-4"), "-o", str(tmp_path / "a")).returncode == 0
    assert ditty("export", str(run), "-o", str(tmp_path / "m"), "--merge-lora").returncode == 0
    ids = torch.tensor([[1, 40, 41, 42, 43, 44]])
    with torch.no_grad():
        trained = AutoPeftModelForCausalLM.from_pretrained(run / "final").eval()(ids).logits
        adapter = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "a").eval()(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()(ids).logits
    assert torch.equal(adapter, trained)
    torch.testing.assert_close(merged, trained, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # three `python -m ditty push` processes (HF_ENDPOINT is read at import): ~18 s of CPU
def test_ditty_push_end_to_end_with_a_local_hub(tmp_path, reference):
    from tests.checkpoint.fake_hub import FakeHub

    run, _ = reference
    token = "hf_SentinelTokenNeverWrittenAnywhere0123"
    server = FakeHub().start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
        env.update(
            HF_ENDPOINT=server.url,
            HF_HUB_DISABLE_XET="1",
            HF_TOKEN=token,
            HF_HOME=str(tmp_path / "hf"),
            HF_HUB_DISABLE_TELEMETRY="1",
            PYTHONPATH=str(REPO),
        )
        work = tmp_path / "run"
        import shutil

        shutil.copytree(run, work)
        base = [sys.executable, "-m", "ditty", "push", str(work)]
        missing = subprocess.run(base, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert missing.returncode == 2 and "--repo-id" in missing.stderr
        server.fail_commits = 1
        failed = subprocess.run(
            base + ["--repo-id", "me/resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert failed.returncode == 2 and f"ditty push {work}" in failed.stderr
        assert (work / "final" / "model.safetensors").is_file()  # every local file kept
        ok = subprocess.run(
            base + ["--repo-id", "me/resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert ok.returncode == 0, ok.stderr[-2000:]
        files = server.files["me/resume"]
        assert files["model.safetensors"] == (work / "final" / "model.safetensors").read_bytes()
        assert "config.json" in files and "README.md" in files
        assert "[optimizer]" in files["README.md"].decode()
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path
        assert token not in ok.stdout + ok.stderr + failed.stdout + failed.stderr
    finally:
        server.stop()


@pytest.mark.slow  # a `python -m ditty run` that pushes (HF_ENDPOINT is read at import): ~17 s of CPU
def test_hub_push_from_the_trainer_at_checkpoints_and_end(tmp_path):
    from tests.checkpoint.fake_hub import FakeHub

    token = "hf_SentinelTokenNeverWrittenAnywhere0123"
    server = FakeHub().start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
        env.update(
            HF_ENDPOINT=server.url,
            HF_HUB_DISABLE_XET="1",
            HF_TOKEN=token,
            HF_HOME=str(tmp_path / "hf"),
            HF_HUB_DISABLE_TELEMETRY="1",
            PYTHONPATH=str(REPO),
            OMP_NUM_THREADS="1",
        )
        recipe = write_recipe(tmp_path)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "ditty",
                "run",
                str(recipe),
                "--train.steps",
                "4",
                "--hub.repo_id",
                "me/end",
                "--hub.push",
                "checkpoints",
                "--checkpoint.every",
                "2",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert [c["header"]["summary"] for c in server.commits] == ["ditty: step 2", "ditty: final model, step 4"]
        assert not (tmp_path / "run" / ".hub-staging").exists()
        files = server.files["me/end"]
        assert files["model.safetensors"] == (tmp_path / "run" / "final" / "model.safetensors").read_bytes()
        assert "ditty" in files["README.md"].decode() and "[optimizer]" in files["README.md"].decode()
        for path in tmp_path.rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path
        assert token not in proc.stdout + proc.stderr
    finally:
        server.stop()


FSDP = ("--parallel.kind", "fsdp")


@pytest.mark.slow
@pytest.mark.parametrize("first,second", [(2, 1), (1, 2)])
def test_world_size_change_continues_the_same_global_order(tmp_path, first, second):
    """Killed after step 8 on `first` processes, resumed on `second` (DCP reshards the FSDP state):
    the same global samples follow, and the losses stay within 1e-5 of an uninterrupted run.
    Dropout off: per-rank dropout streams cannot carry over to another world size."""
    no_dropout = RANDOM_LLAMA.replace("attention_dropout = 0.1", "attention_dropout = 0.0")
    ref_recipe = write_recipe(tmp_path, "ref.toml", out="ref", model=no_dropout)
    proc = ditty("run", str(ref_recipe), *FSDP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = losses(tmp_path / "ref")
    recipe = write_recipe(tmp_path, model=no_dropout)
    ditty("run", str(recipe), *FSDP, "--nproc-per-node", str(first), env={"DITTY_TEST_SIGNAL_AT": "8:0:KILL"})
    assert complete_steps(tmp_path / "run")[-1] == "step-8"
    assert (
        json.loads((tmp_path / "run" / "checkpoints" / "step-8" / "ditty_state.json").read_text())["world_size"]
        == first
    )
    proc = ditty("run", str(recipe), *FSDP, "--nproc-per-node", str(second))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from step 8" in proc.stdout
    got = losses(tmp_path / "run")
    assert [s for s, _ in got] == [s for s, _ in ref]
    for (_, a), (_, b) in zip(got, ref):
        assert abs(a - b) <= 1e-5, (got, ref)


@pytest.mark.slow
def test_sigkill_on_two_processes_with_fsdp_resumes_bitwise(tmp_path):
    # micro-batch 2 on each of 2 ranks: 2 accumulation steps, so the kill lands mid-accumulation
    flags = (*FSDP, "--nproc-per-node", "2", "--train.micro_batch_size", "2")
    ref_recipe = write_recipe(tmp_path, "ref.toml", out="ref")
    proc = ditty("run", str(ref_recipe), *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = losses(tmp_path / "ref")
    recipe = write_recipe(tmp_path)
    ditty("run", str(recipe), *flags, env={"DITTY_TEST_SIGNAL_AT": "6:1:KILL"})
    assert complete_steps(tmp_path / "run") == ["step-4"]
    proc = ditty("run", str(recipe), *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from step 4" in proc.stdout
    assert losses(tmp_path / "run") == ref


def test_recipe_differences_ignore_intervals_paths_and_growing_steps():
    from ditty.checkpoint.resume_diff import IGNORED, flatten_recipe, recipe_differences
    from ditty.config import TrainerConfig

    saved = flatten_recipe(TrainerConfig())
    assert "optimizer.lr" in saved and "checkpoint.force_resume" in saved
    current = dict(saved)
    for key in saved:
        if any(key == k or (k.endswith(".") and key.startswith(k)) for k in IGNORED):
            current[key] = "changed"
    current["train.steps"] = 100
    assert recipe_differences({**saved, "train.steps": 50}, current, step=50) == []
    assert recipe_differences({**saved, "train.steps": 50}, {**current, "train.steps": 40}, step=30) == [
        "train.steps: 50 -> 40 (the schedule is rebuilt for the new length at step 30)"
    ]
    assert recipe_differences(saved, {**current, "run.seed": 1, "train.steps": saved["train.steps"]}, step=0) == [
        f"run.seed: {saved['run.seed']} -> 1 (the saved random state is restored; the data order follows the new "
        "seed unless data.shuffle_seed is set)"
    ]
