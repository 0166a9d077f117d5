"""The recipe `ditty init` starts from: complete and runnable as written.

Plain `Trainer.Config()` defaults leave the model unset (there is no sensible default model); the
starter fills in a tiny Llama trained from scratch on the built-in addition data, so that
`ditty init -o r.toml && ditty run r.toml` works, and flags change it from there.
"""

from __future__ import annotations

from dataclasses import replace

from ditty.config.root import TrainerConfig
from ditty.config.sections import ModelConfig, TrainConfig

TINY_LLAMA = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
}


def starter_config(keep_model_defaults: bool = False) -> TrainerConfig:
    """The starter recipe; with `keep_model_defaults` (the user names a model) the model is theirs."""
    config = TrainerConfig(train=TrainConfig(steps=500))
    if keep_model_defaults:
        return config
    return replace(config, model=ModelConfig(architecture="llama", config=dict(TINY_LLAMA)))


def fit_starter_positions(config: TrainerConfig) -> TrainerConfig:
    """The starter's tiny Llama with room for `data.max_seq_len` positions: `ditty init
    --data.max_seq_len 2048` writes a model with 2048 positions, never fewer than its sequences."""
    positions = config.model.config.get("max_position_embeddings")
    if config.model.path or not isinstance(positions, int) or config.data.max_seq_len <= positions:
        return config
    grown = {**config.model.config, "max_position_embeddings": config.data.max_seq_len}
    return replace(config, model=replace(config.model, config=grown))
