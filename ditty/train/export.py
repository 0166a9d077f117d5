"""`ditty export RUN_OR_CHECKPOINT -o DIR [--merge-lora]`: a checkpoint as a Hugging Face model.

The model is rebuilt from the recipe stored in the checkpoint's sidecar (or the run's recipe.toml)
on one process, the way training built it (same seed, so a random-init base of an adapter run is the
same base; a QLoRA base is loaded quantized as in training), then the checkpoint's model weights are
loaded through DCP, which reshards whatever world size wrote them into one full copy. Only the
model is read (not the optimizer). Reading is pickle-free: `load_checkpoint` uses ditty's safe
reader (tensor metadata without unpickling) and the sidecar is JSON. The exception: a DeepSpeed
run's checkpoint holds DeepSpeed's own files (torch.save pickles), which its zero_to_fp32 reads.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ditty.config.errors import RecipeError
from ditty.train.builders import Builders


def _check_output(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RecipeError.single(
            f"{out} already exists and is not empty; ditty export never overwrites", fix="choose a new or empty -o DIR"
        )


def _recipe(checkpoint: Path, doc: dict):
    from ditty.config.loader import parse_recipe

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
    return parse_recipe(text, source=source)


class _ModelBuilder(Builders):
    """The trainer's own model builders (seed, tokenizer, model and adapters), on one CPU process."""

    def __init__(self, config) -> None:
        self.config, self.world_size, self.rank = config, 1, 0
        self.device = torch.device("cpu")


def export(source: str | os.PathLike, out_dir: str | os.PathLike, *, merge_lora: bool = False) -> str:
    """Write the model of `source` (a run directory or a checkpoint) to `out_dir`; return its path."""
    from ditty.checkpoint import ModelOptimizerState, find_checkpoint, load_checkpoint, read_sidecar
    from ditty.train.final import unwrap_model

    out = Path(out_dir)
    _check_output(out)
    checkpoint = find_checkpoint(source, key="")  # a command-line argument, not a recipe key
    doc = read_sidecar(checkpoint)
    config = _recipe(checkpoint, doc).config
    adapter = config.peft.kind != "none"
    if merge_lora and not adapter:
        raise RecipeError.single(
            f"{checkpoint} is a full finetune: there is no adapter to merge", fix="drop --merge-lora"
        )

    builder = _ModelBuilder(config)
    builder.build_seed()
    builder.tokenizer = builder.build_tokenizer()
    model = builder.build_model()
    if config.parallel.kind == "deepspeed":  # DeepSpeed's own files inside the checkpoint (zero_to_fp32)
        from ditty.train.deepspeed_engine import load_weights_for_export

        load_weights_for_export(model, str(checkpoint), strict=not adapter)
    else:
        load_checkpoint(checkpoint, {"train": ModelOptimizerState(model, None, trainable_only=adapter)})
    model = unwrap_model(model).eval()

    partial = out.parent / f".{out.name}.partial"
    if partial.exists():
        import shutil

        shutil.rmtree(partial)
    if merge_lora:
        from ditty.models.merge import save_merged

        save_merged(model, str(partial), builder.tokenizer)
    else:
        if not hasattr(model, "save_pretrained"):
            raise RecipeError.single(
                f"the model of {checkpoint} is a custom nn.Module without save_pretrained",
                key="model.factory",
                fix="export works for Hugging Face models",
            )
        model.save_pretrained(str(partial))
        if hasattr(builder.tokenizer, "save_pretrained"):
            builder.tokenizer.save_pretrained(str(partial))
    if out.exists():
        out.rmdir()  # empty (checked above)
    os.replace(partial, out)
    print(
        f"exported {checkpoint} (step {doc['step']}) to {out}"
        + (" (adapter merged into the base)" if merge_lora else " (adapter)" if adapter else "")
    )
    return str(out)
