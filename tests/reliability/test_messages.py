"""Faults that ended in a Python traceback (exit 1) and now end in a message: exit 2 for a user's
input, 130 or 143 for a signal; nothing the user has on disk changes.

The issue's cases here: `generate --max-new-tokens -5`, a 1000-deep nested TOML (RecursionError in
tomllib), a symlink loop as the data path (ELOOP), `{"step": Infinity}` in metrics.jsonl on resume,
`ditty check` passing a `model.config` typo that `run` refuses, and SIGTERM to one worker of two
(`ValueError: None is not a valid Signals`).
"""

from __future__ import annotations

import shutil
import signal
import time

import psutil
import pytest

from tests.reliability.helpers import complete_steps, ditty, ditty_process, losses, no_traceback, write_recipe


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finished")
    result = ditty("run", str(write_recipe(tmp, steps=4)))
    assert result.code == 0, result.err[-3000:]
    return tmp / "run"


def test_generate_with_a_negative_token_count_is_a_message(finished_run, trial):
    trial.update(fault="generate --max-new-tokens -5", injected="ditty generate RUN 1+1= --max-new-tokens -5")
    before = _snapshot(finished_run)
    result = ditty("generate", str(finished_run), "1+1=", "--max-new-tokens", "-5")
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 2 and no_traceback(result), result.err[-3000:]
    assert "--max-new-tokens -5: it takes a number of tokens of at least 1" in result.err
    assert _snapshot(finished_run) == before


def test_a_deeply_nested_recipe_is_a_message(tmp_path, trial):
    trial.update(fault="a 1000-deep nested TOML", injected="a = [[[...]]] nested 1,000 deep, for check and run")
    recipe = tmp_path / "deep.toml"
    recipe.write_text("a = " + "[" * 1000 + "]" * 1000 + "\n")
    for command in ("check", "run"):
        result = ditty(command, str(recipe))
        assert result.code == 2 and no_traceback(result), result.err[-3000:]
        assert f"{recipe}: arrays or inline tables are nested too deeply to read" in result.err
    trial.update(exit_code=2, lost_steps=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.toml"]


def test_a_symlink_loop_as_the_data_path_is_a_message(tmp_path, trial):
    trial.update(fault="a symlink loop as the data path", injected="data.path -> a link to itself (ELOOP)")
    loop = tmp_path / "loop.jsonl"
    loop.symlink_to(loop)
    recipe = write_recipe(tmp_path, steps=4)
    text = recipe.read_text().replace('source = "builtin"\nname = "addition"', f'source = "file"\npath = "{loop}"')
    recipe.write_text(text.replace("num_samples = 240\n", ""))
    result = ditty("run", str(recipe))
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 2 and no_traceback(result), result.err[-3000:]
    assert f"`data.path` cannot read the data file '{loop}': Too many levels of symbolic links" in result.err


def test_check_refuses_the_model_config_typo_that_run_refuses(tmp_path, trial):
    trial.update(fault="model.config typo under ditty check", injected="model.config.num_hiden_layers = 2")
    recipe = write_recipe(tmp_path, steps=4)
    recipe.write_text(recipe.read_text().replace("num_hidden_layers = 2", "num_hiden_layers = 2"))
    checked = ditty("check", str(recipe))
    trial.update(exit_code=checked.code, lost_steps=0)
    assert checked.code == 2 and no_traceback(checked), checked.err[-3000:]
    message = f"{recipe}:11: `model.config.num_hiden_layers` unknown llama config field: num_hiden_layers"
    assert message in checked.err and 'did you mean "num_hidden_layers"?' in checked.err
    run = ditty("run", str(recipe))
    assert run.code == 2 and message in run.err, run.err[-3000:]
    assert not (tmp_path / "run").exists()


def test_a_step_of_infinity_in_metrics_is_skipped_on_resume(finished_run, tmp_path, trial):
    trial.update(fault='{"step": Infinity} in metrics.jsonl on resume', injected="the line appended; steps 4 -> 6")
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": Infinity}\n')
    # Extending a finished run is asked for in so many words (tests/reliability/test_finished_runs.py).
    result = ditty("run", str(write_recipe(tmp_path, steps=6)), "--checkpoint.overwrite_finished", "true")
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 0 and no_traceback(result), result.err[-3000:]
    assert "resumed from step 4" in result.out
    assert [step for step, _ in losses(run)] == [1, 2, 3, 4, 5, 6]
    assert "Infinity" not in (run / "metrics.jsonl").read_text()


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_sigterm_to_one_worker_stops_the_run_like_sigterm_to_the_launcher(tmp_path, trial):
    trial.update(fault="SIGTERM to one worker of a 2-process run", injected="SIGTERM to rank 1's pid")
    pace = '\n[[pipeline.preprocessors]]\nuse = "tests.reliability.hooks:Pace"\n'
    recipe = write_recipe(tmp_path, steps=400, extra=pace)
    text = recipe.read_text().replace("every = 2\n", "every = 5\n")
    recipe.write_text(text.replace("[logging]", '[parallel]\nkind = "ddp"\n\n[logging]'))
    launcher = ditty_process(
        "run", str(recipe), "--nproc-per-node", "2", env={"DITTY_TEST_STEP_SLEEP": "0.05"}, wait=False
    )
    run = tmp_path / "run"
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "step-5").is_dir():
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "the 2-process run did not reach step 5"
            time.sleep(0.3)
        rank1 = next(w for w in psutil.Process(launcher.pid).children() if w.environ().get("RANK") == "1")
        rank1.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=180)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    done = max(step for step, _ in losses(run))
    trial.update(exit_code=launcher.returncode, lost_steps=done - complete_steps(run)[-1])
    assert launcher.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "None is not a valid Signals" not in err, err[-3000:]
    assert "stopped by SIGTERM after step" in out and "checkpoint saved in" in out
    assert complete_steps(run)[-1] == done


@pytest.mark.slow
def test_two_exports_into_one_directory(finished_run, tmp_path, trial):
    trial.update(fault="two ditty export into one directory", injected="two `ditty export RUN -o DIR` started at once")
    out = tmp_path / "exported"
    exports = [ditty_process("export", str(finished_run), "-o", str(out), wait=False) for _ in range(2)]
    results = []
    for process in exports:
        stdout, stderr = process.communicate(timeout=300)
        results.append((process.returncode, stdout + stderr))
    codes = sorted(code for code, _ in results)
    trial.update(exit_code=", ".join(map(str, codes)), lost_steps=0)
    assert codes == [0, 2], results
    assert all("Traceback" not in text for _, text in results), results
    refused = next(text for code, text in results if code == 2)
    assert "another `ditty export` is writing" in refused or "already exists and is not empty" in refused, refused
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]  # no .partial, no .lock left


def test_a_force_resume_after_a_shape_change_says_shape_mismatch(finished_run, tmp_path, trial):
    trial.update(
        fault="force-resume after a shape change",
        injected="model.config.hidden_size 32 -> 64, --checkpoint.force_resume true",
    )
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = _snapshot(run)
    recipe = write_recipe(tmp_path, steps=6)
    recipe.write_text(recipe.read_text().replace("hidden_size = 32", "hidden_size = 64"))
    # The run is finished: extending it is asked for in so many words (test_finished_runs.py).
    result = ditty("run", str(recipe), "--checkpoint.force_resume", "true", "--checkpoint.overwrite_finished", "true")
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 2 and no_traceback(result), result.err[-3000:]
    last = result.err[result.err.index("could not be loaded") :]
    assert "shape mismatch: Size mismatch between saved torch.Size([259, 32]) and current: torch.Size([259, 64])" in (
        last
    )
    assert "File " not in last and "CheckpointException" not in last, last
    assert _snapshot(run) == before


@pytest.mark.slow  # a python -m ditty run interrupted in its save, then the rerun: ~20 s of CPU
def test_a_second_ctrl_c_during_a_save_is_exit_130_and_the_rerun_resumes(tmp_path, trial):
    trial.update(fault="a second Ctrl-C during a save", injected="SIGINT as the step-4 save begins, SIGINT inside it")
    recipe = write_recipe(tmp_path, steps=6)
    recipe.write_text('trainer = "tests.reliability.hooks:InterruptInSave"\n' + recipe.read_text())
    run = tmp_path / "run"
    done = ditty_process("run", str(recipe), env={"DITTY_TEST_INTERRUPT_AT_STEP": "4"}, timeout=300)
    trial.update(exit_code=done.returncode, lost_steps=4 - 2)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "interrupted" in done.stderr, done.stderr[-3000:]
    assert complete_steps(run) == [2]
    rerun = ditty("run", str(recipe))  # the same command line, in this process: no fault left to inject
    assert rerun.code == 0 and "resumed from step 2" in rerun.out, rerun.err[-3000:]
    assert complete_steps(run)[-1] == 6 and (run / "final" / "model.safetensors").is_file()


def test_num_labels_in_model_config_is_not_called_unknown(tmp_path, trial):
    trial.update(fault="model.config.num_labels under ditty check", injected="model.config.num_labels = 1")
    recipe = write_recipe(tmp_path, steps=4)
    recipe.write_text(recipe.read_text().replace("num_hidden_layers = 2", "num_hidden_layers = 2, num_labels = 1"))
    checked = ditty("check", str(recipe))
    trial.update(exit_code=checked.code, lost_steps=0)
    assert checked.code == 0 and "unknown" not in checked.text, checked.text[-3000:]


def test_export_does_not_warn_about_the_optimizer_it_leaves_out(finished_run, tmp_path, trial):
    trial.update(fault="export warns about checkpoint values", injected="ditty export RUN -o DIR (model only)")
    result = ditty("export", str(finished_run), "-o", str(tmp_path / "exported"))
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 0 and no_traceback(result), result.err[-3000:]
    assert "has no place for" not in result.text, result.text[-3000:]


def test_an_optimizer_kind_switch_under_force_resume_blames_the_optimizer(tmp_path, trial):
    trial.update(
        fault="force-resume after an optimizer-kind switch",
        injected="optimizer.kind adamw -> adafactor, --checkpoint.force_resume true",
    )
    assert ditty("run", str(write_recipe(tmp_path, steps=4))).code == 0
    result = ditty(
        "run", str(write_recipe(tmp_path, steps=6)), "--optimizer.kind", "adafactor",
        "--checkpoint.force_resume", "true", "--checkpoint.overwrite_finished", "true",
    )  # fmt: skip
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 2 and no_traceback(result), result.err[-3000:]
    assert "`optimizer.kind` the optimizer state in checkpoint" in result.err, result.err[-3000:]
    assert "(saved with optimizer.kind = 'adamw') does not fit the optimizer the recipe builds" in result.err
    assert "into the model" not in result.err


def test_export_with_merge_lora_is_quiet_about_the_checkpoint(tmp_path, tiny_llama_dir):
    import re

    recipe = write_recipe(tmp_path, steps=4, extra='[peft]\nkind = "lora"\nr = 4\nalpha = 8')
    text = re.sub(r"\[model\]\n.*?\n\n", f'[model]\npath = "{tiny_llama_dir}"\n\n', recipe.read_text(), flags=re.S)
    recipe.write_text(text)
    assert ditty("run", str(recipe)).code == 0
    result = ditty("export", str(tmp_path / "run"), "--merge-lora", "-o", str(tmp_path / "merged"))
    assert result.code == 0 and no_traceback(result), result.err[-3000:]
    assert "adapter merged into the base" in result.text, result.text[-3000:]
    assert "has no place for" not in result.text and "warning" not in result.text.lower(), result.text[-3000:]
    assert (tmp_path / "merged" / "model.safetensors").is_file()


def _edited_vocabulary(source, target, vocab_size: int):
    import json

    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config["vocab_size"] = vocab_size
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_a_model_whose_config_disagrees_with_its_weights_is_refused_by_check(tmp_path, tiny_llama_dir, trial):
    """config.json's vocab_size 300, the weights' embedding table 259 rows: loading raised
    RuntimeError (... ignore_mismatched_sizes), exit 1, and `check` passed it."""
    from pathlib import Path

    trial.update(
        fault="a model directory whose config.json vocab_size disagrees with its weights",
        injected="vocab_size 259 -> 300 in config.json, as model.path and as distill.teacher",
    )
    model = _edited_vocabulary(Path(tiny_llama_dir), tmp_path / "model", 300)
    recipe = write_recipe(tmp_path, steps=3)
    flags = ["--model.path", str(model), "--model.init", "pretrained", "--model.config", "{}"]
    for command in ("check", "run"):
        result = ditty(command, str(recipe), *flags)
        assert result.code == 2 and no_traceback(result), result.err[-3000:]
        assert "`model.path`" in result.err and "vocab_size = 300" in result.err and "259 rows" in result.err
    assert not (tmp_path / "run" / "checkpoints").exists()
    teacher = ["--distill.kind", "gkd", "--distill.teacher", str(model), "--rollout.max_new_tokens", "4"]
    result = ditty("check", str(recipe), *teacher)
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 2 and "`distill.teacher`" in result.err and "vocab_size = 300" in result.err, result.err


def test_a_pretrained_student_is_loaded_as_it_is_and_a_random_one_from_a_path_says_so(tmp_path, trial):
    """tiny_distill --model.path DIR --model.init pretrained: the recipe's 64-wide model.config was
    applied to a 32-wide checkpoint (a size-mismatch traceback) although check said it had no effect;
    with the recipe's init = "random", --model.path DIR trained a random student without a word. Fix
    lines name model.init, never model.resolved_init (no key a user can set)."""
    from tests.rl.helpers import save_turn_ending_llama

    trial.update(
        fault="tiny_distill --model.path DIR (32 wide) with --model.init pretrained, and with its init random",
        injected="the recipe's 64-wide model.config beside a 32-wide checkpoint",
    )
    model = save_turn_ending_llama(tmp_path / "model")
    quick = ["--distill.teacher", model, "--train.steps", "2", "--train.eval_every", "0", "--train.eval_samples", "0"]
    quick += ["--data.num_samples", "200", "--train.global_batch_size", "8", "--train.micro_batch_size", "8"]
    quick += ["--scheduler.warmup_steps", "0", "--logging.progress", "false"]
    pretrained = ditty("run", "tiny_distill", "--model.path", model, "--model.init", "pretrained", *quick,
                       "--run.output_dir", str(tmp_path / "pretrained"))  # fmt: skip
    trial.update(exit_code=pretrained.code, lost_steps=0)
    assert pretrained.code == 0 and no_traceback(pretrained), pretrained.err[-3000:]
    assert '`model.config` has no effect because model.init = "pretrained"' in pretrained.err, pretrained.err
    assert "resolved_init" not in pretrained.text
    from safetensors import safe_open

    with safe_open(str(tmp_path / "pretrained" / "final" / "model.safetensors"), "pt") as weights:
        assert weights.get_tensor("model.embed_tokens.weight").shape[1] == 32  # the checkpoint's width
    random = ditty("check", "tiny_distill", "--model.path", model, *quick)
    assert random.code == 0 and "`model.init`" in random.err and "its weights are not loaded" in random.err, random.err


def test_a_failed_push_names_the_retry_with_the_repository_it_was_given(finished_run, tmp_path, monkeypatch, trial):
    """A push whose repository came from --repo-id advised `ditty push RUN`, which then failed for want
    of a repository (the run's recipe names none)."""
    trial.update(fault="ditty push --repo-id without a token", injected="HF_TOKEN unset, HF_HOME empty")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    result = ditty("push", str(finished_run), "--repo-id", "me/tiny")
    trial.update(exit_code=result.code, lost_steps=0)
    assert result.code == 2 and no_traceback(result), result.err[-3000:]
    assert "no Hugging Face token found" in result.err, result.err
    assert f"then retry with `ditty push {finished_run} --repo-id me/tiny`" in result.err, result.err
    retried = ditty("push", str(finished_run))  # what the message said before: no repository to push to
    assert retried.code == 2 and "no Hub repository" in retried.err
