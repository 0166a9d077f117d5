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


def _ported_example_losses(tmp_path, backend: str, steps: int):
    from examples.ported_from_ditty import main

    result = main(str(tmp_path / "run"), max_steps=steps, optim_backend=backend)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    return result, [r["loss"] for r in rows]


def test_ported_from_ditty_example_trains_lora_with_8bit_adam(tmp_path, capsys):
    torch.set_num_threads(1)
    from ditty import CheckpointManager

    result, losses = _ported_example_losses(tmp_path, "bnb", 30)
    assert result.steps == 30 and losses[0] > 3.3 and losses[-1] < losses[0] - 1.0, losses  # ln(32) = 3.47
    assert "contracts: 7 of 7 stages checked; the chain fits" in capsys.readouterr().out
    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").exists() and (final / "adapter_model.safetensors").exists()
    checkpoint = CheckpointManager(str(tmp_path / "run")).load(15)  # checkpoint_every = max_steps // 2
    assert any(t.dtype == torch.uint8 for t in checkpoint.optimizer_state.values())  # 8-bit Adam's state


@pytest.mark.slow
def test_ported_from_ditty_example_with_torchao_8bit_adam(tmp_path):
    # torchao compiles its update on the first step (a minute or more on a shared CPU).
    torch.set_num_threads(1)
    result, losses = _ported_example_losses(tmp_path, "torchao", 30)
    assert losses[-1] < losses[0] - 1.0, losses
