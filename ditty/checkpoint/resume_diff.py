"""How a recipe change takes effect when a run resumes (`checkpoint.force_resume`).

A resumed run is built from the recipe as it is now; the checkpoint brings back the weights, the
optimizer's state (moments, step counts), the data position and the step. So a changed value
applies from the resumed step on, and the words below say exactly how, for the resume diff that
lists every changed key. The learning rate in particular: the scheduler restores only the step
count (`ditty.optim.closed_form`) and the optimizer keeps the recipe's hyperparameters
(`ditty.checkpoint.stateful`), so the rate is the recipe's schedule evaluated at that step.
"""

from __future__ import annotations

# (dotted key or section prefix ending in "."), how it takes effect; the first match wins.
_EFFECTS: tuple[tuple[str, str], ...] = (
    (
        "optimizer.lr",
        "the learning-rate schedule is rebuilt from the recipe at step {step}: the new rate applies from there",
    ),
    (
        "scheduler.",
        "the learning-rate schedule is rebuilt from the recipe at step {step}: the new rate applies from there",
    ),
    ("optimizer.kind", "the saved optimizer state must fit the new optimizer, or loading fails"),
    ("optimizer.backend", "the saved optimizer state must fit the new implementation, or loading fails"),
    ("optimizer.", "the optimizer keeps its saved state; this hyperparameter is the recipe's from step {step} on"),
    ("train.steps", "the schedule is rebuilt for the new length at step {step}"),
    ("train.global_batch_size", "steps after {step} take the new batch; the data position (a sample count) carries on"),
    ("train.micro_batch_size", "only the split of each batch changes, from step {step} on"),
    ("train.", "applies from step {step} on"),
    ("data.", "the data is rebuilt from the recipe; the saved data position (a sample count) continues in it"),
    ("model.", "the saved weights are loaded into the model the recipe builds: a changed shape fails to load"),
    ("peft.", "the saved adapter weights are loaded into the adapter the recipe builds: a changed shape fails to load"),
    ("quant.", "the saved weights are loaded into the model the recipe builds: a changed shape fails to load"),
    (
        "run.seed",
        "the saved random state is restored; the data order follows the new seed unless data.shuffle_seed is set",
    ),
    ("parallel.", "the checkpoint is resharded for the new layout when it loads"),
)


def effect_of_change(key: str, step: int) -> str:
    """How a change of `key` takes effect in a run resumed at `step`."""
    for prefix, text in _EFFECTS:
        if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
            return text.format(step=step)
    return f"applies from step {step} on"
