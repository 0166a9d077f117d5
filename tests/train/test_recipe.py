"""The default recipe loads, and its first steps run through `run_training` (what `ditty run` calls)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ditty.config.loader import load_recipe
from ditty.train.entry import run_training

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny_sft.toml"


def test_tiny_sft_runs_two_steps(tmp_path):
    loaded = load_recipe(str(RECIPE))
    config = loaded.config
    assert config.model.init == "random" and config.tokenizer.kind == "byte" and config.train.precision == "fp32"
    assert config.run.output_dir == "runs/tiny_sft"
    config = replace(
        config,
        run=replace(config.run, output_dir=str(tmp_path / "run")),
        data=replace(config.data, num_samples=2000),
        train=replace(config.train, steps=2, eval_samples=8),
        scheduler=replace(config.scheduler, warmup_steps=1),
        logging=replace(config.logging, progress=False),
    )
    result = run_training(replace(loaded, config=config))
    assert result.steps == 2 and "val_exact_match" in result.eval_metrics
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
