"""The run directory: refusing to clobber user files, the resolved recipe, and `final/`.

A directory counts as a ditty run when it holds ditty's `env.json` (written at the start of every
run). What a run does with an existing one (resume it, refuse it, or report it finished) is the
resume policy of `checkpoint.resume`, in `ditty.train.checkpointing.plan_resume`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import torch

from ditty.config.errors import RecipeError

log = logging.getLogger("ditty.train")

FINAL_DIR = "final"
RUN_MARKER = "env.json"


def is_ditty_run(path: str) -> bool:
    marker = os.path.join(path, RUN_MARKER)
    if not os.path.isfile(marker):
        return False
    try:
        with open(marker, encoding="utf-8") as f:
            return "ditty_version" in json.load(f)
    except (OSError, ValueError):
        return False


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
    try:
        text = recipe_to_toml(config, trainer=trainer_ref)
    except (TypeError, ValueError) as exc:
        # A config built in Python may hold values TOML cannot say (None inside a dict, objects):
        # training goes on, but there is no re-runnable recipe to write.
        log.warning("recipe.toml not written: the config is not expressible in TOML (%s)", exc)
        return None
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The user's model under DDP or DeepSpeed (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    from ditty.train.deepspeed_engine import is_engine

    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel) or is_engine(model):
            model = model.module
        else:
            return model


def save_final(
    model: torch.nn.Module,
    tokenizer: Any,
    run_dir: str,
    *,
    merged: bool = False,
    state_dict: Optional[dict[str, torch.Tensor]] = None,
) -> str:
    """Write `final/` in Hugging Face format (safetensors, config, tokenizer); return its path.

    Written to `final.partial/` and then renamed, so a crash mid-write never leaves a half model
    where an earlier complete one was. The caller runs this on rank 0 only (full, unsharded model).
    Adapter (PEFT) models save their adapter, which PeftModel/AutoPeftModelForCausalLM load, and
    with `merged` also `final/merged/`: the adapter merged into the base (for a 4-bit base, into
    its dequantized weights), a full model that `from_pretrained` loads.
    `state_dict`: the full weights gathered from a sharded (FSDP) model, saved (and merged) instead
    of the model's own (which hold only this rank's shards).
    """
    final = os.path.join(run_dir, FINAL_DIR)
    partial = final + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    model = unwrap_model(model)
    if hasattr(model, "save_pretrained"):
        extra = {"state_dict": state_dict} if state_dict is not None else {}
        model.save_pretrained(partial, **extra)  # transformers 5 always writes safetensors
    elif state_dict is not None:
        from safetensors.torch import save_file

        os.makedirs(partial, exist_ok=True)
        # Tied weights arrive as one tensor under two names: safetensors refuses shared storage.
        save_file(
            {k: v.contiguous().clone() for k, v in state_dict.items()}, os.path.join(partial, "model.safetensors")
        )
    else:  # a custom nn.Module from `model.factory`: weights only
        from safetensors.torch import save_model

        os.makedirs(partial, exist_ok=True)
        save_model(model, os.path.join(partial, "model.safetensors"))
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(partial)
    if merged and hasattr(model, "peft_config"):
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
    from ditty.checkpoint.manifest import describe_all  # reliability: final/manifest.json, verified on read

    describe_all(Path(partial))
    old = final + ".old"
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(partial, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
