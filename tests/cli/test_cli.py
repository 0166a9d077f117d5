"""The command line, run in-process (importing the stack per subprocess costs seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ditty.cli import main
from ditty.config.bundled import bundled_recipes
from ditty.config.loader import load_recipe

BAD = Path(__file__).resolve().parents[1] / "config" / "bad_recipes"


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_there_are_bundled_recipes():
    assert any(recipe.name == "tiny_sft" for recipe in bundled_recipes())


# Recipes that start from another bundled recipe's run, and the model path they read.
STARTS_FROM_A_RUN = {
    "tiny_dpo": "runs/tiny_sft_start/final",
    "tiny_grpo": "runs/tiny_sft_start/final",
    "tiny_reward": "runs/tiny_sft/final",
    "tiny_distill": "runs/tiny_sft/final",
    "tiny_tools": "runs/tiny_tools_sft/final",
}


def stand_in_first_stage(recipe_name: str, tmp_path, monkeypatch, request) -> None:
    """A second-stage recipe reads its first stage's final/: a tiny model stands in for it, in tmp_path."""
    if recipe_name in STARTS_FROM_A_RUN:
        import shutil

        monkeypatch.chdir(tmp_path)
        shutil.copytree(request.getfixturevalue("tiny_llama_dir"), tmp_path / STARTS_FROM_A_RUN[recipe_name])


@pytest.mark.parametrize("recipe", bundled_recipes(), ids=lambda r: r.name)
def test_every_bundled_recipe_checks(capsys, recipe, tmp_path, monkeypatch, request):
    stand_in_first_stage(recipe.name, tmp_path, monkeypatch, request)
    code, out, err = run_cli(capsys, "check", recipe.name)
    assert code == 0, err
    assert "ok: the recipe is valid" in out


WEAK_START = (
    'ditty run tiny_sft --train.stop_when "val_exact_match >= 0.4" --train.eval_every 25 '
    "--run.output_dir runs/tiny_sft_start"
)
FIRST_STAGE_COMMANDS = {
    "tiny_dpo": WEAK_START,
    "tiny_grpo": WEAK_START,
    "tiny_reward": "ditty run tiny_sft",
    "tiny_distill": "ditty run tiny_sft",
    "tiny_tools": "ditty run tiny_tools_sft",
}
# The key that names the first stage's final model: the teacher, for a distillation.
FIRST_STAGE_KEY = {"tiny_distill": "distill.teacher"}


@pytest.mark.parametrize("recipe", sorted(FIRST_STAGE_COMMANDS))
def test_a_second_stage_checked_before_its_first_names_the_command_that_makes_it(capsys, recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a fresh clone: no runs/ yet
    code, out, err = run_cli(capsys, "check", recipe)
    assert code == 2, out + err
    key = FIRST_STAGE_KEY.get(recipe, "model.path")
    assert f"`{key}` local directory '{STARTS_FROM_A_RUN[recipe]}' does not exist" in err, err
    assert f"it is the final model of a first stage: make it with `{FIRST_STAGE_COMMANDS[recipe]}`" in err, err


def test_every_file_under_recipes_is_bundled():
    folder = Path(__file__).resolve().parents[2] / "recipes"
    assert {p.stem for p in folder.glob("*.toml")} == {r.name for r in bundled_recipes()}


def test_ls_lists_recipes_with_descriptions(capsys):
    code, out, _ = run_cli(capsys, "ls")
    assert code == 0
    for recipe in bundled_recipes():
        line = next(line for line in out.splitlines() if line.startswith(recipe.name))
        assert recipe.description and recipe.description in line


def test_init_then_check(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(
        capsys,
        "init",
        "--optimizer.lr",
        "3e-4",
        "--model.init",
        "random",
        "--model.architecture",
        "llama",
        "--tokenizer.kind",
        "byte",
        "-o",
        "r.toml",
    )
    assert code == 0, err
    assert load_recipe("r.toml").config.optimizer.lr == 3e-4
    code, out, err = run_cli(capsys, "check", "r.toml")
    assert code == 0, err


def test_init_as_the_issue_writes_it_is_valid_toml_even_when_incomplete(capsys, tmp_path, monkeypatch):
    """`ditty init --optimizer.lr 3e-4 -o r.toml && ditty check r.toml`: the defaults are runnable."""
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "init", "--optimizer.lr", "3e-4", "-o", "r.toml")[0] == 0
    code, _, err = run_cli(capsys, "check", "r.toml")
    assert code == 0, err


def test_the_starter_recipe_trains(capsys, tmp_path, monkeypatch):
    """The README's first steps: `ditty init -o r.toml`, `ditty check r.toml`, `ditty run r.toml`.
    Its tokenizer.kind "auto" with no path is the byte tokenizer, for check and run alike."""
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "init", "--train.steps", "2", "-o", "r.toml")[0] == 0
    assert run_cli(capsys, "check", "r.toml")[0] == 0
    code, out, err = run_cli(capsys, "run", "r.toml", "--logging.progress", "false", "--run.num_threads", "1")
    assert code == 0, err
    assert (tmp_path / "runs" / "ditty" / "final" / "model.safetensors").is_file()


def test_init_never_overwrites(capsys, tmp_path):
    target = tmp_path / "mine.toml"
    target.write_text("precious")
    code, _, err = run_cli(capsys, "init", "-o", target)
    assert code == 2 and "already exists" in err
    assert target.read_text() == "precious"


def test_init_refuses_a_directory_and_a_flag_the_recipe_cannot_run_with(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    for flags in (["-o", "recipes"], ["-o", "recipes", "--force"]):
        code, _, err = run_cli(capsys, "init", *flags)
        assert code == 2 and "recipes is a directory" in err and "Traceback" not in err, err
    code, _, err = run_cli(capsys, "init", "--train.steps", "-1", "-o", "r.toml")
    assert code == 2 and "`train.steps` must be at least 1" in err
    assert not (tmp_path / "r.toml").exists()  # never a recipe that `ditty check` refuses
    code, out, _ = run_cli(capsys, "init", "--help")
    assert code == 0 and "--force" in out and "--gpu-memory" in out


def test_init_writes_comments_for_every_field(capsys):
    code, out, _ = run_cli(capsys, "init")
    assert code == 0
    assert "# Peak learning rate." in out and "[parallel]" in out and "# path =  (not set)" in out


def test_typo_gives_line_and_suggestion(capsys):
    code, _, err = run_cli(capsys, "check", BAD / "typo_lr.toml")
    assert code == 2
    assert "typo_lr.toml:2:" in err and "did you mean `lr`?" in err
    assert "Traceback" not in err


def test_ten_mistakes_all_listed(capsys):
    code, _, err = run_cli(capsys, "check", BAD / "ten_mistakes.toml")
    assert code == 2
    assert "10 problems" in err and err.count("error:") == 10


def test_cross_field_rules(capsys):
    code, _, err = run_cli(capsys, "check", BAD / "cross_field.toml")
    assert code == 2
    for key in ("train.global_batch_size", "train.log_every", "scheduler.warmup_steps", "hub.repo_id"):
        assert f"`{key}`" in err
    assert "warning:" in err and "optimizer.momentum" in err  # set but ignored by adamw


def test_output_dir_that_is_a_file(capsys, tmp_path):
    existing = tmp_path / "a_file"
    existing.write_text("x")
    code, _, err = run_cli(capsys, "check", "tiny_sft", "--run.output_dir", existing)
    assert code == 2 and "is an existing file" in err
    assert existing.read_text() == "x"


def test_flags_override_and_explain_shows_provenance(capsys):
    code, out, err = run_cli(
        capsys, "check", "tiny_sft", "--optimizer.lr", "1e-3", "--train.compile", "false", "--explain"
    )
    assert code == 0, err
    lines = {line.split("=")[0].strip(): line for line in out.splitlines() if " = " in line}
    assert "[flag]" in lines["optimizer.lr"] and "0.001" in lines["optimizer.lr"]
    assert "[flag]" in lines["train.compile"]
    assert "[toml, line" in lines["model.init"]
    assert "[default]" in lines["hub.push"]


def test_bad_flags_exit_2(capsys):
    code, _, err = run_cli(capsys, "check", "tiny_sft", "--optimizer.lrr", "1", "--train.steps", "many")
    assert code == 2
    assert "did you mean --optimizer.lr?" in err and "train.steps" in err


def test_help_lists_every_section(capsys):
    import dataclasses

    from ditty.config import TrainerConfig

    code, out, _ = run_cli(capsys, "run", "--help")
    assert code == 0
    for field in dataclasses.fields(TrainerConfig):
        assert f"--{field.name}." in out


@pytest.mark.parametrize(
    "args",
    [
        ["run"],
        ["check", "no/such/file.toml"],
        ["frobnicate"],
        ["plot", "/nonexistent"],
        ["generate", "/nonexistent", "hi"],
        ["check", "."],
        ["ls", "extra"],
    ],
)
def test_user_errors_exit_2_without_traceback(capsys, args):
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    assert "Traceback" not in err and err.strip()


def test_python_recipe_reference(capsys):
    code, out, err = run_cli(capsys, "check", "tests.config.python_recipes:tiny_experiment", "--train.steps", "7")
    assert code == 0, err
    assert "steps            7" in out


def test_unknown_command_suggests(capsys):
    code, _, err = run_cli(capsys, "chek", "x")
    assert code == 2 and "ditty check" in err


def test_export_of_a_missing_path_exits_2_naming_no_recipe_key(capsys, tmp_path):
    code, _, err = run_cli(capsys, "export", str(tmp_path / "nowhere"), "-o", str(tmp_path / "out"))
    assert code == 2 and "no complete checkpoint at" in err
    assert "checkpoint.resume" not in err  # the path came from the command line, not a recipe key
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine with a CUDA device runs it")
def test_cuda_asked_for_where_there_is_none_is_named(capsys, tmp_path):
    code, _, err = run_cli(
        capsys,
        "run",
        "tiny_sft",
        "--run.device",
        "cuda",
        "--train.steps",
        "1",
        "--scheduler.warmup_steps",
        "0",
        "--run.output_dir",
        tmp_path / "run",
    )
    assert code == 2 and '`run.device` is "cuda", but this machine has no usable CUDA device' in err, err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_plot_never_replaces_a_file_in_a_directory_that_is_not_a_run(capsys, tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (tmp_path / "curves.png").write_bytes(b"the user's own picture")
    code, _, err = run_cli(capsys, "plot", tmp_path)
    assert code == 2 and "is not a ditty run directory" in err
    assert (tmp_path / "curves.png").read_bytes() == b"the user's own picture"
    (tmp_path / "recipe.toml").write_text("")
    (tmp_path / "metrics.jsonl").write_text("not json\n")
    code, _, err = run_cli(capsys, "plot", tmp_path)
    assert code == 2 and "holds no readable record (1 unreadable lines)" in err
    assert (tmp_path / "curves.png").read_bytes() == b"the user's own picture"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["check", "--train.steps", "5", "tiny_sft"],
            "takes the recipe first, before its flags (found 'tiny_sft' last)",
        ),
        (["generate", "runs/x", "1+1=", "--bogus"], "`ditty generate` has no option --bogus"),
        (["export", "runs/x", "-o", "out", "--merge"], "`ditty export` has no option --merge"),
        (["push", "runs/x", "--repo", "me/x"], "`ditty push` has no option --repo"),
        (["eval", "runs/x", "--task", "hellaswag"], "`ditty eval` has no option --task"),
        (["plot", "runs/x", "--all"], "`ditty plot` has no option --all"),
        (
            [
                "init",
                "--model",
                "meta-llama/Meta-Llama-3-8B",
                "--method",
                "lora",
                "--gpu-memory",
                "24GB",
                "--model.path",
                "x",
            ],
            "--model meta-llama/Meta-Llama-3-8B and --model.path both name the model",
        ),
    ],
)
def test_a_misplaced_recipe_and_an_unknown_option_are_named(capsys, args, words):
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and words in err, err
