"""Which recipe keys differ between a checkpoint and the run resuming it, and how each change takes
effect when the run resumes anyway (`checkpoint.force_resume`).

A checkpoint's sidecar holds its recipe flattened to {dotted key: JSON value} (`flatten_recipe`);
`recipe_differences` names the keys that change training (`IGNORED` never do).

A resumed run is built from the recipe as it is now; the checkpoint brings back the weights, the
optimizer's state (moments, step counts), the data position and the step. So a changed value
applies from the resumed step on, and the words below say exactly how, for the resume diff that
lists every changed key. The learning rate in particular: the scheduler restores only the step
count (`ditty.optim.closed_form`) and the optimizer keeps the recipe's hyperparameters
(`ditty.checkpoint.stateful`), so the rate is the recipe's schedule evaluated at that step.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Optional

# Dotted keys (a trailing "." means the whole section) that never count as a recipe difference on
# resume: where things go and how often they are logged, evaluated, saved or pushed.
IGNORED = (
    "run.output_dir",
    "run.name",
    "run.num_threads",
    "logging.",
    "hub.",
    "train.eval_every",
    "train.eval_samples",
    "train.log_every",
    "checkpoint.every",
    "checkpoint.every_minutes",
    "checkpoint.keep_last",
    "checkpoint.async_save",
    "checkpoint.resume",
    "checkpoint.force_resume",
    "checkpoint.fallback",
    "checkpoint.overwrite_finished",
    # Held-out sets and benchmarks do not change training; workers only prepare the
    # same batches (a stream read by another number of workers is refused by the stream itself).
    "data.eval.",
    "data.num_workers",
    "data.prefetch_factor",
    "eval.",
)
SIDECAR_RECIPE = "recipe"  # flat {dotted key: value} of the recipe, to name differing keys
SIDECAR_DATA_FILES = "data_files"  # {local data file: content fingerprint}, to notice changed data


def _default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return repr(value)


def jsonable(value: Any) -> Any:
    """`value` as JSON holds it: dataclasses as dicts, anything JSON cannot say as its repr."""
    return json.loads(json.dumps(value, default=_default))


def flatten_recipe(config: Any, trainer_ref: Optional[str] = None) -> dict[str, Any]:
    """{dotted key: JSON value} for every field of the config tree (the form stored in the sidecar)."""
    out: dict[str, Any] = {}

    def walk(obj: Any, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = obj.__dict__[f.name]
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                walk(value, f"{prefix}{f.name}.")
            else:
                out[prefix + f.name] = jsonable(value)

    walk(config, "")
    out["trainer"] = trainer_ref
    return out


def _ignored(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in IGNORED)


def under_current_names(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved flat recipe with the keys that moved since under their current names
    (ditty.config.aliases.MOVED_KEYS): a checkpoint of `rl.backend` is one of `rollout.backend`."""
    from ditty.config.aliases import MOVED_KEYS

    out = dict(saved)
    for old, new in MOVED_KEYS.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    return out


def recipe_differences(saved: dict[str, Any], current: dict[str, Any], *, step: int) -> list[str]:
    """The keys whose difference changes training, as "key: saved -> current (how it takes effect)" lines."""
    saved = under_current_names(saved)
    lines = []
    for key in sorted(set(saved) | set(current)):
        old, new = saved.get(key, "<absent>"), current.get(key, "<absent>")
        if old == new or _ignored(key):
            continue
        if old == "<absent>" and new == _defaults().get(key, "<absent>"):
            continue  # a key a later ditty added, at its default: the saved run trained as it says
        if key in ("rl.backend", "rollout.backend") and {old, new} == {"transformers", "generate"}:
            continue  # one backend under its old and new names
        if (
            key == "train.steps"
            and isinstance(new, int)
            and (old is None or isinstance(old, int))
            and new >= step
            and (old is None or new >= old)
        ):
            continue  # more steps: allowed, the schedule is rebuilt for the new total
        if key == "parallel.kind" and "deepspeed" not in (old, new):
            continue  # the same steps on any engine; DCP reshards the files (DeepSpeed's: check_resumable)
        if key in ("parallel.tp", "parallel.cp"):
            continue  # the same steps on another mesh: DCP reshards the 2-D shards into any other layout
        # reliability: each difference says how it takes effect (ditty.checkpoint.resume_diff)
        lines.append(f"{key}: {json.dumps(old)} -> {json.dumps(new)} ({effect_of_change(key, step)})")
    return lines


@functools.lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    """The flattened default recipe (what a key means when a recipe leaves it out)."""
    from ditty.config import TrainerConfig

    return flatten_recipe(TrainerConfig())


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
