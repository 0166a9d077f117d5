"""The trainer (layer 4): `Trainer` with its nested `Config`, the loop's steps, the run directory.

`Trainer(config).train()` runs a recipe; `generate(run_dir, prompt)` shows what a run learned.
"""

from ditty.train.generate import generate
from ditty.train.state import NonFiniteLossError, TrainState
from ditty.train.trainer import Trainer, TrainResult

__all__ = ["NonFiniteLossError", "TrainResult", "TrainState", "Trainer", "generate"]
