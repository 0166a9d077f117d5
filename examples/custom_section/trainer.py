"""An experiment that adds its own recipe section by subclassing `Trainer.Config`.

A recipe selects it with `trainer = "examples.custom_section.trainer:MyTrainer"` at its top; the
`[greeting]` table is then part of the schema (checked, documented, overridable with
`--greeting.text`), and the subclass reads it in one of its named steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ditty.train import Trainer


@dataclass(frozen=True)
class GreetingConfig:
    text: str = "hello"
    """Printed once when training starts."""
    times: int = 1
    """How many times to print it."""


class MyTrainer(Trainer):
    @dataclass(frozen=True)
    class Config(Trainer.Config):
        greeting: GreetingConfig = field(default_factory=GreetingConfig)
        """An example section of this experiment."""

    def train(self):
        for _ in range(self.config.greeting.times):
            print(self.config.greeting.text)
        return super().train()
