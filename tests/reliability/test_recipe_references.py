"""User code a recipe names (`ditty run pkg.mod:obj`, `trainer = "pkg.mod:Class"`): what is not a
trainer, a Trainer.Config or a function returning one is refused before it is called, and a module
that fails (or exits) while it is imported is a user error naming its file and line, never a
silent exit 0 or a traceback."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tests.reliability.helpers import REPO, ditty, no_traceback, write_recipe


def _ditty_in(cwd, *args: str) -> subprocess.CompletedProcess:
    """`python -m ditty ARGS` from `cwd`, as a user in that directory would type it."""
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "ditty", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_reference_that_is_not_a_recipe_is_never_called(command, tmp_path, trial):
    trial.update(fault=f"run: `ditty {command} os:abort`", injected="a built-in function named as the recipe")
    result = _ditty_in(tmp_path, command, "os:abort")  # a process of its own: abort() would kill this one
    trial.update(exit_code=result.returncode, lost_steps=0)
    assert result.returncode == 2 and no_traceback(result), result.stderr[-2000:]
    assert "os:abort is a built-in function, not a Trainer subclass" in result.stderr
    assert "it was not called" in result.stderr
    wrong = _ditty_in(tmp_path, command, "shutil:rmtree")  # a Python function, but one that takes a path
    assert wrong.returncode == 2 and "takes required arguments (path)" in wrong.stderr


MODULES = {
    "SyntaxError": ("def broken(:\n    pass\n", 1, "invalid syntax"),
    "ValueError": ('LIMIT = 1\nraise ValueError("no GPU budget left")\n', 2, "raised ValueError: no GPU budget left"),
    "sys.exit(0)": ("import sys\n\nsys.exit(0)\n", 3, "called sys.exit(0)"),
}


@pytest.mark.parametrize("kind", sorted(MODULES))
def test_a_trainer_module_that_fails_at_import_is_exit_2_with_its_file_and_line(kind, tmp_path, monkeypatch, trial):
    source, line, said = MODULES[kind]
    trial.update(fault=f"run: trainer module with {kind} at import", injected=f"trainer = MODULE:T, {kind} in it")
    module = f"user_trainer_{uuid.uuid4().hex[:8]}"  # a fresh name: nothing cached from another test
    (tmp_path / f"{module}.py").write_text(source)
    recipe = write_recipe(tmp_path, steps=2)
    recipe.write_text(f'trainer = "{module}:T"\n' + recipe.read_text())
    monkeypatch.chdir(tmp_path)  # user code is imported from the current directory, like `python -m`
    for command in ("check", "run"):
        result = ditty(command, str(recipe))
        assert result.code == 2 and no_traceback(result), result.err[-2000:]
        assert "recipe.toml:1: `trainer`" in result.err and said in result.err
        assert f"{tmp_path / module}.py, line {line}" in result.err
    trial.update(exit_code=result.code, lost_steps=0)
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_a_recipe_function_from_the_current_directory_still_runs(tmp_path, monkeypatch):
    """`ditty check mymod:fn` imports the user's own module from where they stand."""
    module = f"my_recipes_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from ditty.config.sections import ModelConfig\nfrom ditty.train import Trainer\n\n\n"
        "def tiny() -> Trainer.Config:\n"
        '    return Trainer.Config(model=ModelConfig(init="random", architecture="llama"))\n'
    )
    monkeypatch.chdir(tmp_path)
    result = ditty("check", f"{module}:tiny")
    assert "ok: the recipe is valid" in result.out and no_traceback(result), result.err[-2000:]
