"""Reading a run directory that may come from anyone: commands that read a run (export, push, eval,
generate, check RUN_DIR) never import code its files name unless `--trust-run-code`, and never
use a damaged final/ (recipe.toml included: final/ keeps a copy of it in its manifest)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.reliability.helpers import REPO, ditty, final_weights, no_traceback, overwrite, same_weights, write_recipe

TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run (checkpoints at steps 2 and 4, final/)."""
    tmp = tmp_path_factory.mktemp("finished")
    result = ditty("run", str(write_recipe(tmp, steps=4)))
    assert result.code == 0, result.err[-3000:]
    return tmp / "run"


def _snapshot(run: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != "run.lock"}


def _rehash(directory: Path) -> None:
    """What a thorough forger does after editing: write the manifest again (it is not a signature)."""
    from ditty.checkpoint import manifest

    manifest.write(directory, {0: manifest.describe(directory, manifest.files_of_rank(directory, 0))})


def _plant_payload(run: Path, marker: Path) -> str:
    """payload.py in the run directory, named by every copy of its recipe; returns its reference."""
    (run / "payload.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n\n"
        "from ditty.train import Trainer\n\n\nclass T(Trainer):\n    pass\n"
    )
    reference = f"{run.name}.payload:T"
    line = f'trainer = "{reference}"\n'
    for recipe in (run / "recipe.toml", run / "final" / "recipe.toml"):
        recipe.write_text(line + recipe.read_text())
    _rehash(run / "final")
    for step in (run / "checkpoints").glob("step-*"):
        sidecar = step / "ditty_state.json"
        doc = json.loads(sidecar.read_text())
        doc["recipe_toml"] = line + doc["recipe_toml"]
        sidecar.write_text(json.dumps(doc))
        _rehash(step)
    return reference


def _ditty_in(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m ditty ARGS` typed in `cwd` (which `python -m` puts first on sys.path)."""
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "ditty", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_run_directory_s_code_is_never_imported_by_its_readers(finished, tmp_path, monkeypatch, trial):
    trial.update(
        fault="run dir: code named by its recipe.toml",
        injected='payload.py in the run, trainer = "RUN.payload:T" in recipe.toml, final/ and sidecars, rehashed',
    )
    run = tmp_path / f"downloaded_{uuid.uuid4().hex[:8]}"  # an importable name, fresh for sys.modules
    shutil.copytree(finished, run)
    marker = tmp_path / "PAYLOAD_RAN"
    reference = _plant_payload(run, marker)
    before = _snapshot(run)

    # The reproduction: `python -m ditty export RUN` from the directory that holds RUN.
    exported = _ditty_in(tmp_path, "export", run.name, "-o", "exported")
    assert exported.returncode == 0 and no_traceback(exported), exported.stderr[-3000:]
    assert same_weights(final_weights(finished), _load(tmp_path / "exported"))  # the trainer is not needed

    # The other readers, in this process, with the current directory first on sys.path as `python -m` has it.
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    checked = ditty("check", run.name)
    assert checked.code == 2 and no_traceback(checked), checked.err[-3000:]
    assert f"trainer = '{reference}'" in checked.err and "--trust-run-code" in checked.err
    pushed = ditty("push", run.name)
    assert pushed.code == 2 and "no Hub repository" in pushed.err and no_traceback(pushed), pushed.err[-2000:]
    scored = ditty("eval", run.name)
    assert scored.code == 2 and "no task to run" in scored.err and no_traceback(scored), scored.err[-2000:]
    said = ditty("generate", run.name, "1+1=", "--max-new-tokens", "2")
    assert said.code == 0 and no_traceback(said), said.err[-2000:]
    trial.update(exit_code=exported.returncode, lost_steps=0)

    assert not marker.exists()  # nothing it names ran
    assert _snapshot(run) == before  # and nothing in it changed
    # The flag is what stands in the way: with it, check imports the trainer as a recipe run would.
    trusted = ditty("check", run.name, "--trust-run-code")
    assert trusted.code == 0 and marker.read_text() == "imported", trusted.err[-3000:]


def _load(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    rows = [
        {"question": f"{a}+{b}=", "choices": [str(a + b), str(a + b + 1)], "answer": 0}
        for a in range(3)
        for b in range(2)
    ]
    (folder / "arith.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "arith.yaml").write_text(TASK.format(name="reliability_arith", data=folder / "arith.jsonl"))
    return folder


DAMAGES = {
    "model.safetensors": (
        "4 KB overwritten in final/model.safetensors",
        lambda final: overwrite(final / "model.safetensors", 5_000),
    ),
    "recipe.toml": (
        "final/recipe.toml edited",
        lambda final: (final / "recipe.toml").write_text(
            (final / "recipe.toml").read_text().replace("seed = 0", "seed = 1")
        ),
    ),
}


@pytest.mark.parametrize("damaged", sorted(DAMAGES))
def test_every_reader_of_final_refuses_a_damaged_file(damaged, finished, tasks_dir, tmp_path, trial):
    pytest.importorskip("lm_eval")
    how, damage = DAMAGES[damaged]
    trial.update(fault=f"run dir: final/{damaged} damaged, every reader", injected=how)
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    evaluate = ("eval", str(run), "--tasks", "reliability_arith", "--include-path", str(tasks_dir), "--limit", "4")
    clean = ditty(*evaluate)
    assert clean.code == 0 and "reliability_arith/acc" in clean.out, clean.err[-3000:]
    damage(run / "final")
    before = _snapshot(run)
    results = {
        "eval": ditty(*evaluate),
        "generate": ditty("generate", str(run), "1+1=", "--max-new-tokens", "2"),
        "push": ditty("push", str(run), "--repo-id", "someone/model"),
    }
    for command, result in results.items():
        assert result.code == 2 and no_traceback(result), (command, result.err[-2000:])
        assert f"final is damaged: {damaged}" in result.err, (command, result.err[-2000:])
    assert _snapshot(run) == before  # no score recorded, no card rewritten
    # export reads the intact last checkpoint, not final/: it is how final/ is written again.
    exported = ditty("export", str(run), "-o", str(tmp_path / "exported"))
    assert exported.code == 0, exported.err[-2000:]
    assert same_weights(_load(tmp_path / "exported"), final_weights(finished))
    trial.update(exit_code=results["eval"].code, lost_steps=0)


def test_a_grpo_run_s_reward_module_is_never_imported_by_its_readers(tmp_path, monkeypatch, trial):
    trial.update(
        fault="run dir: reward module named by rl.rewards",
        injected="rl.rewards names a module that writes a marker when imported; then the module is deleted",
    )
    from ditty.config.writer import recipe_to_toml
    from tests.rl.helpers import grpo_config, with_rl

    module = f"grpo_rewards_{uuid.uuid4().hex[:8]}"  # fresh for sys.modules
    code_dir, marker = tmp_path / "code", tmp_path / "REWARD_MODULE_IMPORTED"
    code_dir.mkdir()
    (code_dir / f"{module}.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n\n"
        "def score(prompts, completions, **columns):\n    return [float(len(c)) for c in completions]\n"
    )
    config = grpo_config(tmp_path, train=dict(steps=2), checkpoint=dict(every=2))
    recipe = tmp_path / "grpo.toml"
    recipe.write_text(recipe_to_toml(with_rl(config, rewards=[f"{module}:score"])))
    monkeypatch.syspath_prepend(str(code_dir))
    trained = ditty("run", str(recipe))
    assert trained.code == 0, trained.err[-3000:]
    run = tmp_path / "run"

    # The module is still importable: the readers must not import it.
    marker.unlink()
    sys.modules.pop(module, None)
    checked = ditty("check", str(run))
    assert checked.code == 2 and no_traceback(checked), checked.err[-3000:]
    assert f"rl.rewards[0] = '{module}:score'" in checked.err and "--trust-run-code" in checked.err
    exported = ditty("export", str(run), "-o", str(tmp_path / "exported"))
    assert exported.code == 0 and no_traceback(exported), exported.err[-3000:]
    assert not marker.exists() and module not in sys.modules
    assert same_weights(final_weights(run), _load(tmp_path / "exported"))

    # Gone altogether (the run downloaded elsewhere): export needs no reward, even when trusted.
    shutil.rmtree(code_dir)
    exported = ditty("export", str(run), "-o", str(tmp_path / "exported-trusted"), "--trust-run-code")
    trial.update(exit_code=exported.code, lost_steps=0)
    assert exported.code == 0 and no_traceback(exported), exported.err[-3000:]
    # A check that trusts the run imports its rewards as a run would, and says the module is gone.
    trusted = ditty("check", str(run), "--trust-run-code")
    assert trusted.code == 2 and f"cannot import module '{module}'" in trusted.err, trusted.err[-3000:]


def test_ditty_s_own_reward_functions_are_no_code_to_trust():
    from ditty.config.references import code_references
    from ditty.config.rl import RLConfig
    from tests.rl.helpers import grpo_config

    config = grpo_config(Path("/nonexistent"))
    assert code_references(config) == []  # ditty.objectives.rewards.builtin_rewards:exact_match
    foreign = __import__("dataclasses").replace(config, rl=RLConfig(kind="grpo", rewards=["mine:score"]))
    assert code_references(foreign) == ["rl.rewards[0] = 'mine:score'"]


def test_a_run_s_environment_and_tool_modules_are_never_imported_by_its_readers(tmp_path, monkeypatch, trial):
    trial.update(
        fault="run dir: environment and tool modules named by rl.environment and rl.tools",
        injected="rl.environment and rl.tools name modules that write a marker when imported",
    )
    from ditty.config.writer import recipe_to_toml
    from tests.rl.helpers import grpo_config, with_rl

    tag = uuid.uuid4().hex[:8]  # fresh for sys.modules
    game, tools = f"run_game_{tag}", f"run_tools_{tag}"
    code_dir, marker = tmp_path / "code", tmp_path / "MODULE_IMPORTED"
    code_dir.mkdir()
    plant = f"import pathlib\npathlib.Path({str(marker)!r}).write_text(__name__)\n\n"
    (code_dir / f"{game}.py").write_text(
        plant + "from ditty.objectives.environments.protocol import StepResult\n\n\n"
        "class Game:\n    def reset(self, row):\n        return [{'role': 'user', 'content': row['prompt']}]\n\n"
        "    def step(self, completion):\n        return StepResult(reward=float(len(completion)), done=True)\n"
    )
    (code_dir / f"{tools}.py").write_text(plant + "def shout(text: str) -> str:\n    return text.upper()\n")
    config = grpo_config(tmp_path, train=dict(steps=2), checkpoint=dict(every=2))
    config = with_rl(config, rewards=[], environment=f"{game}:Game", tools=[f"{tools}:shout"], max_episode_tokens=32)
    recipe = tmp_path / "grpo.toml"
    recipe.write_text(recipe_to_toml(config))
    monkeypatch.syspath_prepend(str(code_dir))
    trained = ditty("run", str(recipe))
    assert trained.code == 0, trained.err[-3000:]
    run = tmp_path / "run"

    # Both modules are still importable: the readers must import neither.
    marker.unlink()
    for module in (game, tools):
        sys.modules.pop(module, None)
    checked = ditty("check", str(run))
    assert checked.code == 2 and no_traceback(checked), checked.err[-3000:]
    assert f"rl.environment = '{game}:Game'" in checked.err and f"rl.tools[0] = '{tools}:shout'" in checked.err
    assert "--trust-run-code" in checked.err
    exported = ditty("export", str(run), "-o", str(tmp_path / "exported"))
    trial.update(exit_code=exported.code, lost_steps=0)
    assert exported.code == 0 and no_traceback(exported), exported.err[-3000:]
    assert not marker.exists() and game not in sys.modules and tools not in sys.modules, marker.read_text()
    assert same_weights(final_weights(run), _load(tmp_path / "exported"))
    # Trusted, check imports them as a run would.
    trusted = ditty("check", str(run), "--trust-run-code")
    assert trusted.code == 0 and marker.exists(), trusted.err[-3000:]


def test_ditty_s_own_tools_are_no_code_to_trust():
    from ditty.config.references import code_references
    from tests.rl.helpers import grpo_config, with_rl

    config = with_rl(
        grpo_config(Path("/nonexistent")), tools=["ditty.objectives.environments.tools.builtin_tools:calculator"]
    )
    assert code_references(config) == []
    foreign = with_rl(config, tools=["mine:search"], environment="games:Maze")
    assert code_references(foreign) == ["rl.environment = 'games:Maze'", "rl.tools[0] = 'mine:search'"]
