"""`run_training(loaded)`: what `ditty run` calls once the recipe has compiled.

Picks the trainer class the recipe names (`trainer = "pkg.mod:MyTrainer"`, else ditty's Trainer),
builds it from the loaded config and trains. User errors stay RecipeErrors (exit code 2); a run
that diverges raises NonFiniteLossError (exit code 1).
"""

from __future__ import annotations

from typing import Any, Optional

from ditty.config.errors import RecipeError
from ditty.config.references import import_reference
from ditty.train.trainer import Trainer, TrainResult


def trainer_class(ref: Optional[str]) -> type[Trainer]:
    """The Trainer subclass "package.module:Class" names (already checked by the loader), or Trainer."""
    if not ref:
        return Trainer
    cls = import_reference(ref, key="trainer")
    if not (isinstance(cls, type) and issubclass(cls, Trainer)):
        raise RecipeError.single(
            f"{ref} is not a subclass of ditty.train.Trainer",
            key="trainer",
            fix="name a class that extends ditty.train.Trainer",
        )
    return cls


def run_training(loaded: Any, plan: Any = None) -> TrainResult:
    """Train the recipe a `LoadedRecipe` holds (its `config` and optional `trainer` reference); `plan`
    is its compiled plan when the caller compiled it already (else the Trainer compiles)."""
    from ditty.checkpoint.lock import run_lock_scope
    from ditty.parallel.runtime import process_group_for_run

    cls = trainer_class(getattr(loaded, "trainer", None))
    # torchrun workers leave their process group when the run ends; run.lock is released even when
    # building the trainer fails
    with process_group_for_run(), run_lock_scope():
        return cls(loaded.config, plan=plan).train()
