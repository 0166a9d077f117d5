"""Model specs: a named bundle of build, blocks to shard/checkpoint, loss and contract, used through model.factory."""

from __future__ import annotations

import pytest

from ditty.config.errors import RecipeError
from ditty.models.registry import DIGITS_DENOISER, ModelSpec, model_spec, model_specs, register_model_spec


def test_a_spec_builds_and_carries_its_parallel_plan():
    model = DIGITS_DENOISER(hidden=32)
    assert model.input.out_features == 32
    assert model._no_split_modules == ["ResidualBlock"]
    assert model.ditty_spec is DIGITS_DENOISER
    assert type(DIGITS_DENOISER.make_loss()).__name__ == "MSELoss"


def test_fsdp_finds_the_spec_blocks():
    from ditty.parallel.wrap import find_blocks

    blocks = find_blocks(DIGITS_DENOISER())
    assert len(blocks) == 3 and {type(b).__name__ for b in blocks} == {"ResidualBlock"}


def test_activation_checkpointing_wraps_the_spec_blocks():
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from ditty.parallel.speed import apply_activation_checkpointing

    model = apply_activation_checkpointing(DIGITS_DENOISER(hidden=16), "full")
    assert sum(isinstance(m, CheckpointWrapper) for m in model.modules()) == 3
    x = torch.randn(2, 1, 8, 8)
    model(x, torch.tensor([1, 2])).sum().backward()


def test_registry_lookup():
    assert model_spec("digits_denoiser") is DIGITS_DENOISER and "digits_denoiser" in model_specs()
    with pytest.raises(RecipeError, match="no model spec named 'nope'"):
        model_spec("nope")
    with pytest.raises(ValueError):
        register_model_spec(ModelSpec(name="digits_denoiser", build=dict))


def test_a_recipe_trains_a_spec_with_its_loss(tmp_path):
    pytest.importorskip("sklearn")
    import torch

    from ditty.config import sections as S
    from ditty.train import Trainer

    before = torch.get_num_threads()
    config = Trainer.Config(
        run=S.RunConfig(output_dir=str(tmp_path / "run"), device="cpu", num_threads=1),
        model=S.ModelConfig(factory="ditty.models.registry:DIGITS_DENOISER", factory_kwargs={"hidden": 32}),
        data=S.DataConfig(source="builtin", name="digits"),
        train=S.TrainConfig(steps=3, global_batch_size=16, micro_batch_size=16, eval_samples=0),
        logging=S.LoggingConfig(progress=False),
        pipeline=S.PipelineConfig(preprocessors=[S.ComponentSpec("ditty.diffusion:NoisePreProcessor")]),
    )
    try:
        trainer = Trainer(config)
        assert type(trainer.pipeline.loss).__name__ == "MSELoss"  # from the spec: the recipe names no loss
        assert trainer.train().steps == 3
    finally:
        torch.set_num_threads(before)
