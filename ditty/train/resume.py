"""The resume decision, made before anything is written or loaded, and what a resume rewrites.

The policy (also in docs/checkpoints.md):

- `checkpoint.resume = "auto"`: the newest complete `checkpoints/step-N` of `run.output_dir` is
  resumed when the recipe matches the one it was saved with (keys in `IGNORED` never count; world
  size is not a recipe key; `train.steps` may grow). A different recipe is a RecipeError listing
  the keys, unless `checkpoint.force_resume`. A run whose `final/` exists and whose step count
  reached `train.steps` (or that met `train.stop_when`) is finished: nothing is touched.
- `"never"`: a directory that already holds a run is refused before anything is written.
- a path: that checkpoint (or the newest complete one of that run directory) is resumed, with
  the same recipe check.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ditty.checkpoint import lineage
from ditty.checkpoint.resume_diff import SIDECAR_DATA_FILES, SIDECAR_RECIPE, flatten_recipe, recipe_differences
from ditty.config.errors import RecipeError

log = logging.getLogger("ditty.train")

# ---------------------------------------------------------------------------- the resume decision


@dataclass
class ResumePlan:
    checkpoint: Optional[Path] = None
    """The complete checkpoint to load, or None for a fresh start."""
    finished: bool = False
    """`auto` found a finished run: train() reports it and touches nothing."""
    step: int = 0
    run_id: str = ""
    """The run's id (ditty.checkpoint.lineage), recorded in env.json and every checkpoint."""


def plan_resume(config: Any, trainer_ref: Optional[str], world_size: int = 1) -> ResumePlan:
    """Decide, before anything is written or loaded, whether this run resumes (see the module doc)."""
    from ditty._utils.run_dir import is_ditty_run
    from ditty.checkpoint import find_checkpoint, find_intact, read_sidecar
    from ditty.train.final import FINAL_DIR, check_output_dir

    out = config.run.output_dir
    check_output_dir(out)
    ckpt_cfg = config.checkpoint
    holds_run = os.path.isdir(out) and (is_ditty_run(out) or os.path.isdir(os.path.join(out, "checkpoints")))
    if ckpt_cfg.resume == "never":
        if holds_run:
            raise RecipeError.single(
                f'{out!r} already holds a run and checkpoint.resume = "never"; nothing was touched',
                key="checkpoint.resume",
                fix='choose a new run.output_dir, remove the old run, or set checkpoint.resume = "auto" to continue it',
            )
        return ResumePlan(run_id=lineage.new_run_id())
    if ckpt_cfg.resume == "auto":
        root = Path(out) / "checkpoints"
        # reliability: the newest checkpoint that passes verification; damaged newer ones are reported
        # and skipped, or stop the run when checkpoint.fallback = false (ditty.checkpoint.integrity)
        required = ("train_state", "scheduler", "rng")
        found = find_intact(root, required_fields=required, fallback=ckpt_cfg.fallback).found if root.is_dir() else None
        if found is None:
            refuse_finished(config, "start it again from step 0")
            if holds_run:
                log.warning("%s holds a run without a complete checkpoint: starting again from step 0", out)
            return ResumePlan(run_id=lineage.run_id_for(out, None, None))
    else:
        found = find_checkpoint(ckpt_cfg.resume)

    doc = read_sidecar(found)
    if ckpt_cfg.resume != "auto":
        foreign = lineage.foreign_checkpoint(out, found, doc)
        if foreign:
            raise RecipeError.single(
                foreign,
                key="checkpoint.resume",
                fix=f"resume {found} into a new or empty run.output_dir, or set checkpoint.resume = "
                f'"auto" to continue the run {out} holds',
            )
    step = int(doc["step"])
    steps = config.train.steps
    target = steps if steps is not None else doc.get("total_steps")
    final_exists = os.path.isdir(os.path.join(out, FINAL_DIR))
    reached = target is not None and step >= int(target)
    saved = doc.get(SIDECAR_RECIPE)
    stopped = bool(doc.get("train_state", {}).get("stopped_early")) and same_stop_condition(doc, config)
    finished = ckpt_cfg.resume == "auto" and final_exists and (reached or stopped)
    # First: no setting continues a run past a train.steps below its checkpoint (force_resume neither).
    if steps is not None and step > steps:
        raise RecipeError.single(
            f"checkpoint {found} is at step {step}, past train.steps = {steps}",
            key="train.steps",
            fix=f"use train.steps >= {step}, or a new run.output_dir",
        )
    if isinstance(saved, dict):
        diffs = recipe_differences(saved, flatten_recipe(config, trainer_ref), step=step)
        if diffs and finished and not (ckpt_cfg.force_resume and ckpt_cfg.overwrite_finished):
            raise RecipeError.single(
                f"{out} holds a finished run (step {step}, final/), trained with a recipe that differs from this "
                "one in keys that change training:\n    " + "\n    ".join(diffs),
                key="run.output_dir",
                fix="choose a new run.output_dir to train with the new values from the start; to continue the "
                "finished run with them, raise train.steps and add --checkpoint.force_resume true "
                "--checkpoint.overwrite_finished true (final/ is replaced)",
            )
        if diffs and not ckpt_cfg.force_resume:
            raise RecipeError.single(
                f"the recipe differs from the one checkpoint {found} was saved with, in keys that change "
                f"training:\n    " + "\n    ".join(diffs),
                key="checkpoint.resume",
                fix=f"run the saved recipe ({os.path.join(out, 'recipe.toml')}), choose a new run.output_dir "
                f"to start afresh, or add --checkpoint.force_resume true to continue with the new values",
            )
        if diffs:
            log.warning("resuming despite recipe differences (checkpoint.force_resume): %s", "; ".join(diffs))
    from ditty.train.engines import engine_class

    # Before anything is built or written: a checkpoint resumes only with an engine that can read it.
    engine_class(config.parallel.kind, world_size).check_resumable(found, doc.get("world_size"), world_size)
    if finished:
        return ResumePlan(found, finished=True, step=step)
    _check_data_unchanged(doc, config, found)
    refuse_finished(config, f"resume {found} (step {step}) into it and train to step {target}")
    return ResumePlan(found, step=step, run_id=lineage.run_id_for(out, found, doc))


def same_stop_condition(doc: dict, config: Any) -> bool:
    """Whether the checkpoint `doc` was saved under this recipe's `train.stop_when`. A run that met its
    condition ends there (final/ is written, even when a kill interrupted that); another condition is
    checked anew from the resumed step."""
    saved = doc.get(SIDECAR_RECIPE)
    return not isinstance(saved, dict) or saved.get("train.stop_when", "") == config.train.stop_when


def refuse_finished(config: Any, would: str) -> None:
    """A run directory holding final/ is finished: a run that would write into it (`would` says how)
    stops here, before anything is written, naming what it would replace, unless
    `checkpoint.overwrite_finished`."""
    from ditty.metrics.logger import read_metrics
    from ditty.train.final import FINAL_DIR

    out = config.run.output_dir
    final = os.path.join(out, FINAL_DIR)
    if config.checkpoint.overwrite_finished or not os.path.isdir(final):
        return
    metrics = os.path.join(out, "metrics.jsonl")
    steps = (
        [r["step"] for r in read_metrics(metrics) if isinstance(r.get("step"), int)] if os.path.isfile(metrics) else []
    )
    model = f"final/ (the model it finished with, after step {max(steps)})" if steps else "final/ (its model)"
    replaced = [model] + [name for name in ("recipe.toml", "metrics.jsonl") if os.path.isfile(os.path.join(out, name))]
    raise RecipeError.single(
        f"{out} holds a finished run; this run would {would}, replacing its {', '.join(replaced)}. Nothing was touched",
        key="run.output_dir",
        fix="choose a new run.output_dir (or copy final/ elsewhere first), or add --checkpoint.overwrite_finished true "
        "to replace them",
    )


def _check_data_unchanged(doc: dict, config: Any, found: Path) -> None:
    """A resume trains on the rows the checkpoint's data cursor counts through: refuse when a data
    file's content fingerprint (ditty.data.fingerprint) differs from the one the checkpoint
    recorded, unless checkpoint.force_resume."""
    from ditty.data.fingerprint import changed_files, data_fingerprints

    saved = doc.get(SIDECAR_DATA_FILES)
    if not isinstance(saved, dict) or not saved:
        return  # a checkpoint from before fingerprints, or data that is not local files
    changed = changed_files(saved, data_fingerprints(config.data))
    if not changed:
        return
    if not config.checkpoint.force_resume:
        raise RecipeError.single(
            f"the data changed since checkpoint {found} was saved: " + "; ".join(changed),
            key="data.path",
            fix="put back the data the run was trained on, choose a new run.output_dir to start afresh, or add "
            "--checkpoint.force_resume true to continue on the new data from the saved position",
        )
    log.warning("resuming on changed data (checkpoint.force_resume): %s", "; ".join(changed))


def doc_labels(doc: dict) -> Optional[dict]:
    """The label set a checkpoint's sidecar records (None before labels were recorded, or none)."""
    labels = doc.get("labels")
    return labels if isinstance(labels, dict) else None
