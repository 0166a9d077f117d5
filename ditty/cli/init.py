"""`ditty init`: write a complete, commented recipe, a runnable starter changed by flags, or one
chosen to fit a machine (`--model ID --method ... --gpu-memory ...`, ditty.cli.memory_plan)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from ditty.cli.options import take_option
from ditty.cli.usage import print_help, print_warnings
from ditty.config import RecipeError, TrainerConfig
from ditty.config.loader import from_config
from ditty.config.overrides import apply_overrides
from ditty.config.starter import fit_starter_positions, starter_config
from ditty.recipe import compile_recipe

INTENT_FLAGS = ("--model", "--method", "--gpus", "--gpu-memory", "--nodes", "--data", "--seq-len", "--global-batch")


def cmd_init(args: list[str]) -> int:
    if any(a in ("-h", "--help") for a in args):
        return print_help(TrainerConfig, "ditty init [-o FILE]")
    output, args = take_option(args, ("-o", "--output"))
    force, args = take_option(args, ("--force",), has_value=False)
    intent: dict[str, str] = {}
    for flag in INTENT_FLAGS:
        value, args = take_option(args, (flag, flag.replace("-", "_")))
        if value is not None:
            intent[flag.lstrip("-")] = value
    if intent:
        from ditty.cli import memory_plan as cli_plan

        given_path = [a for a in args if a.partition("=")[0] == "--model.path"]
        if "model" in intent and given_path:
            raise RecipeError.single(
                f"--model {intent['model']} and --model.path both name the model",
                fix="give one: --model ID plans for that model and sets model.path",
            )

        return cli_plan.init_from_intent(intent, args, output, bool(force))
    names_a_model = any(arg.startswith(("--model.", "--model-")) for arg in args)
    loaded = apply_overrides(from_config(starter_config(keep_model_defaults=names_a_model)), args)
    if not names_a_model:
        loaded = replace(loaded, config=fit_starter_positions(loaded.config))
    plan = compile_recipe(loaded)
    too_long = [p for p in plan.errors if p.key == "data.max_seq_len"]
    if too_long:  # a recipe whose sequences outgrow the model's positions is never written
        raise RecipeError(too_long)
    if any(_set_by(problem.key, args) for problem in plan.errors):  # a flag's value is wrong: fix the flag
        raise RecipeError(plan.errors)
    from ditty.config.writer import recipe_to_toml

    text = recipe_to_toml(
        loaded.config,
        header="ditty recipe written by `ditty init`.\nCheck it with `ditty check FILE`, train with `ditty run FILE`.",
    )
    path = writable_recipe_path(output, bool(force))
    if path is None:
        print(text, end="")
    else:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {output}")
    print_warnings(plan)
    if plan.errors:
        print("note: the recipe has problems to fix before it can run:", file=sys.stderr)
        print(RecipeError(plan.errors).format(), file=sys.stderr)
    return 0


def _set_by(key: str, flags: list[str]) -> bool:
    """Whether one of `flags` (--section.field VALUE) set `key`, or a table above or below it."""
    for flag in flags:
        if flag.startswith("--"):
            name = flag[2:].split("=", 1)[0]
            if key == name or key.startswith(name + ".") or name.startswith(key + "."):
                return True
    return False


def writable_recipe_path(output: str | None, force: bool) -> Path | None:
    """Where `ditty init -o FILE` may write: not a directory, not an existing file unless --force."""
    if output is None:
        return None
    path = Path(output)
    if path.is_dir():
        raise RecipeError.single(f"{output} is a directory", fix="give -o the path of a recipe file, e.g. -o r.toml")
    if path.exists() and not force:
        raise RecipeError.single(f"{output} already exists", fix="choose another -o FILE, or add --force to replace it")
    if path.parent and not path.parent.exists():
        raise RecipeError.single(f"directory {path.parent} does not exist", fix="create it first")
    return path
