"""check_model_source: offline, torch-free checks of where the model comes from."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ditty.config.sections import ModelConfig
from ditty.models import check_model_source, read_model_type


def _only(problems):
    assert len(problems) == 1, problems
    return problems[0]


def test_a_saved_model_directory_is_fine(tiny_llama_dir):
    assert check_model_source(ModelConfig(path=tiny_llama_dir)) == []
    assert check_model_source(ModelConfig(path=tiny_llama_dir, init="random", config={"num_hidden_layers": 1})) == []


@pytest.mark.parametrize("path", ["./missing-model", "/no/such/dir", "~/no/such/dir", "a/b/c"])
def test_a_missing_local_path_is_an_error(path):
    problem = _only(check_model_source(ModelConfig(path=path)))
    assert (problem.severity, problem.key) == ("error", "model.path")
    assert "does not exist" in problem.message


def test_a_directory_without_config_json_is_an_error(tmp_path):
    problem = _only(check_model_source(ModelConfig(path=str(tmp_path))))
    assert problem.severity == "error" and "config.json" in problem.message


def test_a_file_is_not_a_model_directory(tmp_path):
    file = tmp_path / "model.bin"
    file.write_bytes(b"")
    assert _only(check_model_source(ModelConfig(path=str(file)))).severity == "error"


def test_an_uncached_hub_id_is_a_warning_not_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    problem = _only(check_model_source(ModelConfig(path="some-org/some-model")))
    assert (problem.severity, problem.key) == ("warning", "model.path")
    assert "cannot be verified offline" in problem.message


def test_an_invalid_hub_id_that_is_no_directory_is_an_error():
    problem = _only(check_model_source(ModelConfig(path="my model")))
    assert problem.severity == "error" and "neither a local directory nor a valid hub id" in problem.message


def test_a_cached_hub_id_is_verified(monkeypatch, tmp_path):
    # The layout huggingface_hub writes: refs/main names the snapshot that holds the files.
    repo = tmp_path / "models--some-org--some-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    (repo / "snapshots" / "0123abcd").mkdir(parents=True)
    (repo / "snapshots" / "0123abcd" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    model = ModelConfig(path="some-org/some-model")
    assert check_model_source(model) == []
    assert read_model_type(model) == "qwen2"


def test_random_init_needs_a_path_or_an_architecture():
    problem = _only(check_model_source(ModelConfig(init="random")))
    assert (problem.severity, problem.key) == ("error", "model.architecture")


def test_pretrained_init_needs_a_path():
    problem = _only(check_model_source(ModelConfig(init="pretrained")))
    assert (problem.severity, problem.key) == ("error", "model.path")


def test_auto_init_is_random_without_a_path():
    assert check_model_source(ModelConfig(architecture="llama")) == []
    assert _only(check_model_source(ModelConfig())).key == "model.architecture"


def test_an_unknown_architecture_names_a_close_match():
    problem = _only(check_model_source(ModelConfig(init="random", architecture="mistrall")))
    assert problem.severity == "error"
    assert '"mistral"' in problem.fix
    assert check_model_source(ModelConfig(init="random", architecture="gpt_neox")) == []


def test_ignored_fields_are_warnings(tiny_llama_dir):
    problem = _only(check_model_source(ModelConfig(path=tiny_llama_dir, init="random", architecture="llama")))
    assert (problem.severity, problem.key) == ("warning", "model.architecture")
    problems = check_model_source(ModelConfig(factory="pkg.mod:build", path="x/y"))
    assert [(p.severity, p.key) for p in problems] == [("warning", "model.path")]


def test_read_model_type(tiny_llama_dir):
    assert read_model_type(ModelConfig(path=tiny_llama_dir)) == "llama"
    assert read_model_type(ModelConfig(init="random", architecture="qwen2")) == "qwen2"
    assert read_model_type(ModelConfig(path="not-cached/anywhere")) is None
    assert read_model_type(ModelConfig(factory="pkg.mod:build")) is None


def test_checking_imports_neither_torch_nor_transformers(tmp_path):
    code = (
        "import sys\n"
        "from ditty.config.sections import ModelConfig\n"
        "from ditty.models import check_model_source\n"
        "check_model_source(ModelConfig(init='random', architecture='lama'))\n"
        "check_model_source(ModelConfig(path='org/name'))\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
