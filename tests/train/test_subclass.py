"""A Trainer subclass adds a recipe section through its nested Config and replaces a named step."""

from __future__ import annotations

from dataclasses import dataclass, field

from ditty.train import Trainer
from tests.train.helpers import read_jsonl, small_config, write_prompt_completion


@dataclass(frozen=True)
class Greeting:
    word: str = "hello"
    """A word the subclass logs."""


class GreetingTrainer(Trainer):
    @dataclass(frozen=True)
    class Config(Trainer.Config):
        greeting: Greeting = field(default_factory=Greeting)

    def step_record(self, out):
        return {**super().step_record(out), "greeting": self.config.greeting.word}


def test_subclass_config_and_overridden_step(tmp_path, tiny_llama_dir):
    base = small_config(tmp_path, tiny_llama_dir, write_prompt_completion(tmp_path / "pc.jsonl"), steps=2)
    config = GreetingTrainer.Config(
        **{name: getattr(base, name) for name in base.__dataclass_fields__}, greeting=Greeting("bonjour")
    )
    result = GreetingTrainer(config).train()
    assert {r.get("greeting") for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")} == {"bonjour"}
    recipe = (tmp_path / "run" / "recipe.toml").read_text()
    assert 'trainer = "tests.train.test_subclass:GreetingTrainer"' in recipe
    assert "[greeting]" in recipe and 'word = "bonjour"' in recipe
    assert result.steps == 2
