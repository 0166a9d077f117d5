"""Each example script runs in-process for a few steps (the scripts' own defaults train longer)."""

from __future__ import annotations

import json

import pytest
import torch

from ditty.cli import main as cli


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_custom_pipeline_example(tmp_path):
    from examples.custom_pipeline import main

    result = main(str(tmp_path / "run"), steps=40)
    assert (
        result.steps == 40 and result.eval_metrics["val_loss"] < 4.5
    )  # predicting the mean scores the variance, about 6


def test_custom_pipeline_example_stops_at_a_misfit(tmp_path):
    from ditty.config.errors import RecipeError
    from examples import custom_pipeline

    with pytest.raises(RecipeError, match="model \\(Regressor\\)"):
        custom_pipeline.Pipeline(
            model_factory=custom_pipeline.ModelFactory.from_instance(custom_pipeline.Regressor()),
            dataset=custom_pipeline.make_rows(8),
            loss_calculator=custom_pipeline.MSELoss(),
            preprocessors=[custom_pipeline.SplitTarget(rank=3)],
            output_dir=str(tmp_path / "x"),
        )


def test_diffusion_pipeline_example(tmp_path):
    pytest.importorskip("sklearn")
    from examples.diffusion_pipeline import main

    result = main(str(tmp_path / "run"), steps=20, samples=16)
    assert (tmp_path / "run" / "samples.png").exists()
    assert {"val_loss", "val_nn_distance", "val_classes"} <= set(result.eval_metrics)


def test_subclassed_trainer_example(tmp_path, capsys):
    pytest.importorskip("sklearn")
    from examples.custom_section.run import main

    result = main(str(tmp_path / "run"), steps=5)
    assert result.steps == 5
    assert capsys.readouterr().out.count("hello from the greeting section") == 2
    recipe = (tmp_path / "run" / "recipe.toml").read_text()
    assert 'trainer = "examples.custom_section.trainer:MyTrainer"' in recipe and "[greeting]" in recipe


def test_config_registry_function_runs_with_flags(tmp_path, capsys):
    pytest.importorskip("sklearn")
    ref = "examples.custom_section.config_registry:greeting_digits"
    out = tmp_path / "run"
    flags = ["--train.steps", "4", "--scheduler.warmup_steps", "1", "--greeting.times", "3"]
    assert cli(["check", ref, *flags]) == 0
    assert cli(["run", ref, *flags, "--run.output_dir", str(out)]) == 0
    assert capsys.readouterr().out.count("hello from the greeting section") == 3
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert rows[-1]["step"] == 4
