"""The run directory: refusing to clobber user files, the resolved recipe, and `final/`.

A directory counts as a ditty run when it holds ditty's `env.json` (written at the start of every
run). What a run does with an existing one (resume it, refuse it, or report it finished) is the
resume policy of `checkpoint.resume`, in `ditty.train.resume.plan_resume`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import TYPE_CHECKING, Any, Optional

import torch

from ditty._utils.atomic import write_text_atomic
from ditty._utils.modules import is_peft_model, unwrap
from ditty._utils.run_dir import is_ditty_run
from ditty.config.errors import RecipeError
from ditty.models.inputs import is_transformers_model

if TYPE_CHECKING:
    from ditty.train.state import TrainRun

log = logging.getLogger("ditty.train")

FINAL_DIR = "final"


def check_output_dir(path: str) -> None:
    """Refuse a non-empty directory that is not a ditty run: never overwrite a user's files."""
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise RecipeError.single(
            f"{path!r} exists and is a file, not a run directory",
            key="run.output_dir",
            fix="choose another run.output_dir",
        )
    from ditty.checkpoint.lock import LOCK_FILE  # reliability: run.lock alone (a run killed at its start) is ours

    if [name for name in os.listdir(path) if name != LOCK_FILE] and not is_ditty_run(path):
        raise RecipeError.single(
            f"{path!r} already holds files that are not a ditty run; ditty will not overwrite them",
            key="run.output_dir",
            fix="choose a new or empty run.output_dir (or remove the directory)",
        )


def write_recipe(run_dir: str, config: Any, trainer_ref: Optional[str]) -> Optional[str]:
    """recipe.toml: the fully resolved recipe, re-runnable as is."""
    from ditty.config.writer import recipe_to_toml  # the lead's writer (layer 1)

    path = os.path.join(run_dir, "recipe.toml")
    if config.checkpoint.overwrite_finished:
        from dataclasses import replace

        # Permission to replace a finished run is given per command, never saved with the recipe.
        config = replace(config, checkpoint=replace(config.checkpoint, overwrite_finished=False))
    try:
        text = recipe_to_toml(config, trainer=trainer_ref)
    except (TypeError, ValueError) as exc:
        # A config built in Python may hold values TOML cannot say (None inside a dict, objects):
        # training goes on, but there is no re-runnable recipe to write.
        log.warning("recipe.toml not written: the config is not expressible in TOML (%s)", exc)
        return None
    write_text_atomic(path, text)  # a full disk leaves the previous recipe.toml (or none), never half of one
    return path


def save_model_files(
    model: torch.nn.Module,
    tokenizer: Any,
    directory: str,
    *,
    state_dict: Optional[dict[str, torch.Tensor]] = None,
    shown_as: Optional[str] = None,
) -> None:
    """The model in Hugging Face format (`save_pretrained`: config and safetensors), or for a custom
    nn.Module its weights as model.safetensors; then the tokenizer's files. `state_dict`: the full
    weights gathered from a sharded model, saved instead of the module's own (which hold one shard).
    `shown_as`: the directory's name in messages (the place it is renamed to, not the one written)."""
    from ditty.models.mtp.weights import saving_heads

    model = unwrap(model)
    pretrained = hasattr(model, "save_pretrained")  # a transformers or peft model
    if pretrained:
        with saving_heads(model, directory, state_dict) as state_dict:  # [mtp] heads: beside the model
            extra = {"state_dict": state_dict} if state_dict is not None else {}
            model.save_pretrained(directory, **extra)  # transformers 5 always writes safetensors
    else:
        from safetensors.torch import save_file

        weights = state_dict if state_dict is not None else model.state_dict()
        # Tied weights arrive as one tensor under two names: safetensors refuses shared storage.
        save_file({k: v.contiguous().clone() for k, v in weights.items()}, os.path.join(directory, "model.safetensors"))
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(directory)
    elif pretrained and is_transformers_model(unwrap(model, peft=True)):
        # AutoTokenizer.from_pretrained on such a directory would not fail: it would quietly build some
        # other tokenizer. So say so now.
        log.warning(
            "%s has no tokenizer (none was given or found beside the model): pass tokenizer= to the Pipeline, or "
            "set [tokenizer] path",
            shown_as or directory,
        )
    if is_peft_model(model):
        save_label_maps(model, directory)


LABELS_FILE = "labels.json"
"""Beside an adapter of a classifier: the base's num_labels, id2label and label2id (a config.json there
would make transformers load the folder as a full model), for building the base before the adapter:
`AutoModelForSequenceClassification.from_pretrained(BASE, id2label={int(i): n for i, n in
labels["id2label"].items()}, label2id=labels["label2id"])` (JSON keys are strings, transformers'
keyword arguments keep them so), then `PeftModel.from_pretrained(base, final)`."""


def save_label_maps(model: torch.nn.Module, directory: str) -> Optional[str]:
    """labels.json for an adapter of a classifier (peft task type SEQ_CLS or TOKEN_CLS); None otherwise."""
    id2label = dict(getattr(getattr(model, "config", None), "id2label", None) or {})
    names = [str(id2label[key]) for key in sorted(id2label, key=int)]
    task_type = getattr(next(iter(model.peft_config.values())), "task_type", None)
    if getattr(task_type, "value", task_type) not in ("SEQ_CLS", "TOKEN_CLS"):
        return None
    path = os.path.join(directory, LABELS_FILE)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(
            {
                "num_labels": len(names),
                "id2label": dict(enumerate(names)),
                "label2id": {n: i for i, n in enumerate(names)},
            },
            f,
            indent=2,
        )
    return path


def save_final(
    model: torch.nn.Module,
    tokenizer: Any,
    run_dir: str,
    *,
    merged: bool = False,
    state_dict: Optional[dict[str, torch.Tensor]] = None,
    card: Optional[Any] = None,
) -> str:
    """Write `final/` in Hugging Face format (safetensors, config, tokenizer); return its path.

    Written beside it and renamed into place (ditty._utils.atomic), so a crash mid-write never leaves
    a half model where an earlier complete one was. The caller runs this on rank 0 only.
    Adapter (PEFT) models save their adapter, which PeftModel and the task's AutoPeftModelFor... load
    (with labels.json for a classifier's base), and with `merged` also `final/merged/`: the adapter
    merged into the base (for a 4-bit base, into its dequantized weights), a full model of the task's
    class that `from_pretrained` and `transformers.pipeline` load. `card(directory)` writes the
    model card (README.md) over whatever the savers put there (peft writes a template).
    """
    from ditty._utils.atomic import atomic_directory

    final = os.path.join(run_dir, FINAL_DIR)
    with atomic_directory(final, replace=True) as partial:
        save_model_files(model, tokenizer, str(partial), state_dict=state_dict, shown_as=final)
        model = unwrap(model)
        if merged and is_peft_model(model):
            from transformers import PreTrainedModel

            from ditty.models.merge import save_merged

            if state_dict is not None and not isinstance(model.get_base_model(), PreTrainedModel):
                # A sharded custom nn.Module has no config to rebuild a plain copy from on rank 0.
                log.warning(
                    'checkpoint.final_format = "merged": final/merged/ not written (a custom model under '
                    "FSDP); run `ditty export %s --merge-lora` for it",
                    run_dir,
                )
            else:
                save_merged(model, os.path.join(partial, "merged"), tokenizer, state_dict=state_dict)
        recipe = os.path.join(run_dir, "recipe.toml")
        if os.path.isfile(recipe):  # the recipe beside the model it made, verified with it (ditty.config.run_recipe)
            shutil.copyfile(recipe, os.path.join(partial, "recipe.toml"))
        if card is not None:
            card(str(partial))
        from ditty.checkpoint.manifest import describe_all

        describe_all(partial)  # final/manifest.json: generate, push and export verify it before use
    return final


def write_final(run: "TrainRun") -> str:
    """`final/` of a training run: the engine gathers the full weights (collective: every rank calls
    this), rank 0 writes them, and no rank goes on before the directory is complete. A failed write
    (a full disk) is a CheckpointSaveError that says which checkpoints are kept."""
    import torch.distributed as dist

    from ditty._utils.atomic import partial_path
    from ditty.checkpoint.disk import write_errors_reported

    full = run.engine.full_state_dict(run.model)
    run_dir = run.config.run.output_dir
    if run.runtime.is_main:
        kept = run.checkpointer.describe_kept()
        final = os.path.join(run_dir, FINAL_DIR)
        from ditty.train.push import final_model_card

        card = final_model_card(run.config, run.run_dir, run.state)
        with write_errors_reported(run_dir, 0, what="final/", kept=kept, cleanup=partial_path(final)):
            merged = writes_merged(run.config)
            save_final(run.model, run.tokenizer, run_dir, merged=merged, state_dict=full, card=card)
    del full
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # nobody reads final/ before it is complete
    return os.path.join(run_dir, FINAL_DIR)


def writes_merged(config: Any) -> bool:
    """Whether final/merged/ is written: `checkpoint.final_format = "merged"`, or by default for an
    adapter of a task with a new head (a classifier, a reward model: ditty.models.tasks), whose adapter
    folder transformers.pipeline cannot load with its labels
    (the base it names has no head of the right size; a config.json beside the adapter makes
    transformers take the folder for a full model). Never from an 8-bit base (the compiler refuses it)."""
    if config.peft.kind == "none" or config.quant.kind == "bnb-8bit":
        return False
    from ditty.models.tasks import model_task

    return config.checkpoint.final_format == "merged" or model_task(config.model.task).head


def final_model_task(run_dir: str) -> Any:
    """The model task (ditty.models.tasks) of a run's final model, or of a saved model directory: what
    its files say (its architecture, or its adapter's task type), else the run's recipe.toml, else
    causal-lm."""
    from ditty.models.task_support import task_of_saved_model
    from ditty.models.tasks import DEFAULT_TASK, model_task

    final = os.path.join(run_dir, FINAL_DIR)
    directory = final if os.path.isdir(final) else run_dir
    found = task_of_saved_model(directory)
    if found is not None:
        return found
    from ditty.config.run_recipe import read_run_recipe

    try:
        loaded = read_run_recipe(run_dir)  # its code is never imported
        if loaded is not None:
            return model_task(loaded.config.model.task)
    except RecipeError:
        pass
    return model_task(DEFAULT_TASK)
