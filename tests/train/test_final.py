"""final/ reloads with from_pretrained and gives the trained model's logits; generate() uses it;
the run directory never overwrites a user's files."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ditty.config.errors import RecipeError
from ditty.train import Trainer, generate
from tests.train.helpers import small_config, write_prompt_completion


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_llama_dir):
    tmp = tmp_path_factory.mktemp("final")
    config = small_config(tmp, tiny_llama_dir, write_prompt_completion(tmp / "pc.jsonl"), steps=3)
    trainer = Trainer(config)
    result = trainer.train()
    return trainer, result


def test_from_pretrained_gives_the_same_logits(trained):
    trainer, result = trained
    loaded = AutoModelForCausalLM.from_pretrained(result.final_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(result.final_dir)
    ids = torch.tensor([tokenizer("rev abcd=")["input_ids"]])
    trainer.model.eval()
    with torch.no_grad():
        expected = trainer.model(input_ids=ids, use_cache=False).logits
        got = loaded(input_ids=ids, use_cache=False).logits
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)
    # the weights really moved away from the starting checkpoint
    start = AutoModelForCausalLM.from_pretrained(trainer.config.model.path).eval()
    with torch.no_grad():
        assert not torch.allclose(start(input_ids=ids, use_cache=False).logits, expected, atol=1e-4)


def test_run_directory_contents(trained):
    _, result = trained
    from pathlib import Path

    run = Path(result.run_dir)
    for name in (
        "recipe.toml",
        "env.json",
        "metrics.jsonl",
        "curves.png",
        "final/config.json",
        "final/model.safetensors",
    ):
        assert (run / name).exists(), name
    env = json.loads((run / "env.json").read_text())
    assert env["world_size"] == 1 and env["seed"] == 0
    assert env["parameters"]["trainable"] == env["parameters"]["total"] > 0
    assert env["packages"]["torch"] and env["python"]
    assert "[train]" in (run / "recipe.toml").read_text()


def test_generate_is_greedy_and_deterministic(trained):
    _, result = trained
    first = generate(result.run_dir, "rev abcd=", max_new_tokens=6)
    assert isinstance(first, str)
    assert generate(result.run_dir, "rev abcd=", max_new_tokens=6) == first


def test_refuses_a_directory_of_user_files(tmp_path, tiny_llama_dir):
    config = small_config(tmp_path, tiny_llama_dir, write_prompt_completion(tmp_path / "pc.jsonl"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "thesis.tex").write_text("precious")
    with pytest.raises(RecipeError, match="not a ditty run"):
        Trainer(config)
    assert (tmp_path / "run" / "thesis.tex").read_text() == "precious"


def test_running_a_finished_run_again_leaves_it_as_it_is(tmp_path, tiny_llama_dir):
    config = small_config(tmp_path, tiny_llama_dir, write_prompt_completion(tmp_path / "pc.jsonl"), steps=1)
    Trainer(config).train()
    weights = tmp_path / "run" / "final" / "model.safetensors"
    before = (weights.stat().st_mtime_ns, weights.read_bytes())
    result = Trainer(config).train()  # checkpoint.resume = "auto" finds the run finished
    assert result.steps == 1
    assert (weights.stat().st_mtime_ns, weights.read_bytes()) == before
