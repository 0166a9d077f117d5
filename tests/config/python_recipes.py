"""A config registry in the torchtitan manner: functions that return a Trainer.Config."""

from ditty.config import TrainerConfig
from ditty.config.sections import ModelConfig, TokenizerConfig, TrainConfig


def tiny_experiment() -> TrainerConfig:
    return TrainerConfig(
        model=ModelConfig(init="random", architecture="llama", config={"hidden_size": 64}),
        tokenizer=TokenizerConfig(kind="byte"),
        train=TrainConfig(steps=3, global_batch_size=8, micro_batch_size=8),
    )
