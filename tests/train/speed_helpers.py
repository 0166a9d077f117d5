"""A few steps of the default recipe's model (all linear dims multiples of 16) for the speed tests."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ditty.config.loader import load_recipe
from ditty.train.trainer import Trainer

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny_sft.toml"


def tiny_config(tmp_path, name: str = "run", steps: int = 4, **sections):
    """tiny_sft shortened to `steps` steps of 16 samples; `sections` maps a section name to field changes."""
    config = load_recipe(str(RECIPE)).config
    config = replace(
        config,
        run=replace(config.run, output_dir=str(tmp_path / name), device="cpu"),
        data=replace(config.data, num_samples=400, val_fraction=0.05),
        train=replace(
            config.train,
            steps=steps,
            global_batch_size=16,
            micro_batch_size=16,
            log_every=1,
            eval_every=0,
            eval_samples=0,
        ),
        scheduler=replace(config.scheduler, kind="constant", warmup_steps=0),
        logging=replace(config.logging, progress=False),
    )
    for section, changes in sections.items():
        config = replace(config, **{section: replace(getattr(config, section), **changes)})
    return config


def train(config) -> tuple[Trainer, list[float]]:
    """Train; return the trainer (its model) and the per-step losses from metrics.jsonl."""
    trainer = Trainer(config)
    trainer.train()
    rows = [json.loads(line) for line in open(Path(config.run.output_dir) / "metrics.jsonl")]
    return trainer, [r["loss"] for r in rows if "loss" in r]
