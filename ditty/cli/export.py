"""`ditty export RUN_OR_CHECKPOINT -o DIR [--merge-lora]`: a checkpoint as a Hugging Face model.

The model is rebuilt from the recipe stored in the checkpoint's sidecar (or the run's recipe.toml)
on one process, the way training built it (same seed, so a random-init base of an adapter run is the
same base; a QLoRA base is loaded quantized as in training), then the checkpoint's model weights are
loaded by the engine that wrote them: DCP reshards whatever world size wrote them into one full copy. Only the
model is read (not the optimizer). Reading is pickle-free: `load_checkpoint` uses ditty's safe
reader (tensor metadata without unpickling) and the sidecar is JSON. The exception: a DeepSpeed
run's checkpoint holds DeepSpeed's own files (torch.save pickles), which its zero_to_fp32 reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

import torch

from ditty.config.errors import RecipeError

REWARDS = ("rl.reward", "rl.environment", "rl.tools")
"""The keys export leaves out of its compile: the reward functions, the environment and the tools,
which it does not load."""


def _check_output(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RecipeError.single(
            f"{out} already exists and is not empty; ditty export never overwrites", fix="choose a new or empty -o DIR"
        )


@contextlib.contextmanager
def _sole_writer(out: Path) -> Iterator[None]:
    """An exclusive flock on `OUT.lock` beside the output while it is written: a second export into
    the same directory is refused at once instead of deleting the first one's partial files."""
    lock_path = Path(f"{out}.lock")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise RecipeError.single(
            f"cannot write beside {out}: {error.strerror or error}", fix="choose -o DIR on a writable filesystem"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise RecipeError.single(
                f"another `ditty export` is writing {out} right now; two would overwrite each other",
                fix="wait for it to finish, or choose another -o DIR",
            ) from None
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.remove(lock_path)  # while still held: a later export makes a fresh one
    finally:
        os.close(fd)


def _recipe(checkpoint: Path, doc: dict, *, trust_code: bool):
    """The recipe the checkpoint was trained with, parsed without importing the code it names unless
    `trust_code` (ditty.config.run_recipe); code the export itself would run is refused without it."""
    from ditty.config.run_recipe import parse_run_recipe, refuse_run_code

    text = doc.get("recipe_toml")
    source = f"{checkpoint} (sidecar)"
    if not text:
        path = checkpoint.parent.parent / "recipe.toml"
        if not path.is_file():
            raise RecipeError.single(
                f"{checkpoint} carries no recipe and {path} does not exist",
                fix="export a checkpoint written by `ditty run`",
            )
        text, source = path.read_text(encoding="utf-8"), str(path)
    loaded = parse_run_recipe(text, source, trust_code=trust_code)
    from dataclasses import replace

    # Reward functions, environments and tools play and score rollouts; rebuilding the model needs
    # none, so they are never imported (the run may have come without them), trusted or not.
    # export() compiles without their rules.
    rl = replace(loaded.config.rl, rewards=[], reward_weights=None, environment="", tools=[])
    loaded = replace(loaded, config=replace(loaded.config, rl=rl))
    if not trust_code:
        # Neither the trainer class nor the [pipeline] stages take part in rebuilding the model, so
        # they are left out (never imported); a factory, converter classes or remote code do.
        config = loaded.config
        stages = replace(config.pipeline, preprocessors=[], postprocessors=[], loss=[])
        loaded = replace(loaded, config=replace(config, pipeline=stages))
    refuse_run_code(loaded, needs=f"exporting {checkpoint}", trust_code=trust_code, ignore_trainer=True)
    return loaded


def _labels(checkpoint: Path, doc: dict, config):
    """A classifier's label set as the checkpoint recorded it (it sizes and names the head)."""
    from ditty.data.labels import LabelSpace
    from ditty.models.tasks import model_task
    from ditty.train.resume import doc_labels

    saved = doc_labels(doc)
    if saved is not None:
        return LabelSpace.from_json(saved)
    if model_task(config.model.task).labels:
        raise RecipeError.single(
            f"{checkpoint} records no label set, which its {config.model.task} model needs to be rebuilt",
            fix="export a checkpoint written by this version of ditty (its sidecar records the labels)",
        )
    return None


def export(
    source: str | os.PathLike, out_dir: str | os.PathLike, *, merge_lora: bool = False, trust_code: bool = False
) -> str:
    """Write the model of `source` (a run directory or a checkpoint) to `out_dir`; return its path.
    `trust_code`: import the code the run's recipe names (`--trust-run-code`), else refuse to."""
    from ditty._utils.atomic import atomic_directory
    from ditty._utils.modules import unwrap
    from ditty.checkpoint import find_checkpoint, read_sidecar
    from ditty.models.converters import apply_converters
    from ditty.models.recipe_model import base_model_for, converters_for
    from ditty.models.task_support import weights_from_checkpoint
    from ditty.parallel.runtime import seed_everything
    from ditty.recipe import compile_recipe
    from ditty.train.builders import tokenizer_for
    from ditty.train.engines import engine_class
    from ditty.train.final import save_model_files

    out = Path(out_dir)
    _check_output(out)
    checkpoint = find_checkpoint(source, key="")  # a command-line argument, not a recipe key
    doc = read_sidecar(checkpoint)
    loaded = _recipe(checkpoint, doc, trust_code=trust_code)
    config = loaded.config
    # The compiler first, as for every entry: a recipe it refuses is not rebuilt (for the world size
    # that trained it, whose mesh rules the recipe was checked against).
    compile_recipe(loaded, world_size=int(doc.get("world_size") or 1), replaced=REWARDS).raise_for_errors()
    adapter = config.peft.kind != "none"
    if merge_lora and not adapter:
        raise RecipeError.single(
            f"{checkpoint} is a full finetune: there is no adapter to merge", fix="drop --merge-lora"
        )

    seed_everything(config.run.seed)  # a random-init base of an adapter run is rebuilt as it was trained
    tokenizer = tokenizer_for(config)
    labels = _labels(checkpoint, doc, config)
    with weights_from_checkpoint():  # a reward model's or classifier's head comes from the checkpoint too
        base, _ = base_model_for(config, tokenizer, torch.device("cpu"), low_memory=False, labels=labels)
    model = apply_converters(base, converters_for(config))
    engine_class(config.parallel.kind, 1).load_for_export(model, checkpoint, adapter=adapter)
    model = unwrap(model).eval()
    with _sole_writer(out):
        _check_output(out)  # again: another export may have finished into it meanwhile
        with atomic_directory(out, replace=False) as partial:
            if merge_lora:
                from ditty.models.merge import save_merged

                save_merged(model, str(partial), tokenizer)
            else:
                save_model_files(model, tokenizer, str(partial), shown_as=str(out))
    print(
        f"exported {checkpoint} (step {doc['step']}) to {out}"
        + (" (adapter merged into the base)" if merge_lora else " (adapter)" if adapter else "")
    )
    return str(out)
