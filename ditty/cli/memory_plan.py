"""The command line's planning parts: `ditty check RECIPE --plan` and `ditty init --method`.

ditty/cli/commands.py parses the flags; this module turns them into a `ditty.plan.Target`, prints the plan
(after an optional probe of real steps), and writes recipes chosen from intent, compiling each
first so that a recipe `ditty check` would refuse is never written.
"""

from __future__ import annotations

import sys

from ditty.config import RecipeError
from ditty.config.loader import LoadedRecipe, from_config
from ditty.config.overrides import apply_overrides
from ditty.plan import Target, make_plan, render
from ditty.plan.devices import device_and_memory
from ditty.plan.intent import annotate, choose_recipe
from ditty.recipe import compile_recipe


def whole_number(options: dict[str, str], name: str, default: int) -> int:
    """A flag that takes a count of at least 1 (--gpus, --nodes, --probe)."""
    try:
        value = int(options.get(name, default))
    except ValueError:
        raise RecipeError.single(f"--{name} takes a whole number", fix=f"e.g. --{name} 2") from None
    if value < 1:
        raise RecipeError.single(f"--{name} must be at least 1, got {value}")
    return value


def plan_target(options: dict[str, str], launch: dict[str, str], config) -> Target:
    """What `--plan` is asked about: GPUs when --gpus/--gpu-memory say so or the recipe does not
    train on the CPU; --gpus and --nodes default to --nproc-per-node and --nnodes."""
    device_name, memory = None, None
    if "gpu-memory" in options:
        device, memory = device_and_memory(options["gpu-memory"])
        device_name = device.name if device else None
    on_gpu = "gpus" in options or memory is not None or _trains_on_gpu(config.run.device)
    gpus = whole_number(options, "gpus", int(launch.get("nproc-per-node", "1")))
    nodes = whole_number(options, "nodes", int(launch.get("nnodes", "1")))
    return Target(device="cuda" if on_gpu else "cpu", gpus_per_node=gpus, nodes=nodes, memory=memory, gpu=device_name)


def _trains_on_gpu(device: str) -> bool:
    """Where `ditty run` would train: "auto" is the GPU only on a machine that has one."""
    if device != "auto":
        return device == "cuda"
    import torch

    return torch.cuda.is_available()


def _compile_errors(world_size: int, flags: list[str] = ()):
    """The recipe compiler's errors for a config the planner made (with the command's flags applied)."""

    def errors(config) -> list:
        return compile_recipe(apply_overrides(from_config(config), list(flags)), world_size=world_size).errors

    return errors


def print_training_plan(loaded: LoadedRecipe, target: Target, probe: str | None) -> None:
    seconds = _probe_seconds(loaded, whole_number({"probe": probe}, "probe", 1)) if probe else None
    errors = _compile_errors(target.world_size)
    plan = make_plan(loaded.config, target, seconds_per_micro_batch=seconds, is_valid=lambda c: not errors(c))
    print(render(plan))


def _probe_seconds(loaded: LoadedRecipe, steps: int) -> float:
    """Seconds per micro-batch of the recipe on this machine: `steps` real optimizer steps of one
    micro-batch each (after one warm-up step), one process, in a temporary run directory."""
    import json
    import tempfile
    from dataclasses import replace

    from ditty.train import Trainer

    cfg = loaded.config
    with tempfile.TemporaryDirectory(prefix="ditty-probe-") as out:
        probe = replace(
            cfg,
            run=replace(cfg.run, output_dir=out),
            train=replace(
                cfg.train,
                steps=steps + 1,
                epochs=1.0,
                global_batch_size=cfg.train.micro_batch_size,
                log_every=1,
                eval_every=0,
                eval_samples=0,
            ),
            parallel=replace(cfg.parallel, kind="none"),
            checkpoint=replace(cfg.checkpoint, every=0, resume="never"),
            hub=replace(cfg.hub, push="never"),
            logging=replace(cfg.logging, progress=False, tensorboard=False, wandb=False),
            scheduler=replace(cfg.scheduler, warmup_steps=0),
        )
        print(f"probe: {steps + 1} steps of one micro-batch on this machine (the first is warm-up)...", flush=True)
        Trainer(probe).train()
        with open(f"{out}/metrics.jsonl", encoding="utf-8") as handle:
            elapsed = [r["elapsed_s"] for r in map(json.loads, handle) if "loss" in r]
    return (elapsed[-1] - elapsed[0]) / max(1, len(elapsed) - 1)


def init_from_intent(intent: dict[str, str], flags: list[str], output: str | None, force: bool) -> int:
    """Choose a recipe that fits (ditty/plan/intent.py), apply the flags on top, compile it, and
    write it only when the compiler accepts it; then print its plan."""
    from ditty.config.writer import recipe_to_toml

    missing = [name for name in ("model", "method", "gpu-memory") if name not in intent]
    if missing:
        raise RecipeError.single(
            f"`ditty init` from intent needs --{' --'.join(missing)}",
            fix="ditty init --model meta-llama/Meta-Llama-3-8B --method lora --gpus 1 --gpu-memory 24GB -o r.toml",
        )
    from ditty.cli.init import writable_recipe_path

    path = writable_recipe_path(output, force)
    device, memory = device_and_memory(intent["gpu-memory"])
    target = Target(
        device="cuda",
        gpus_per_node=whole_number(intent, "gpus", 1),
        nodes=whole_number(intent, "nodes", 1),
        memory=memory,
        gpu=device.name if device else None,
    )
    choice = choose_recipe(
        intent["model"],
        intent["method"],
        target,
        data=intent.get("data"),
        seq_len=whole_number(intent, "seq-len", 2048) if "seq-len" in intent else None,
        global_batch=whole_number(intent, "global-batch", 32),
        problems=_compile_errors(target.world_size, flags),
    )
    loaded = apply_overrides(from_config(choice.config), flags)
    compiled = compile_recipe(loaded, world_size=target.world_size)
    compiled.raise_for_errors()  # never write a recipe `ditty check` refuses
    machine = f"--gpus {target.gpus_per_node}" + (f" --nodes {target.nodes}" if target.nodes > 1 else "")
    machine += f" --gpu-memory {intent['gpu-memory']}"
    launch = f" --nproc-per-node {target.gpus_per_node}" if target.world_size > 1 else ""
    launch += f" --nnodes {target.nodes}" if target.nodes > 1 else ""
    header = (
        f"ditty recipe written by `ditty init --model {intent['model']} --method {intent['method']} {machine}`.\n"
        "Lines marked `# >>` say why `ditty init` chose that value; the plan is at the end.\n"
        f"Check it with `ditty check FILE --plan {machine}`, train with `ditty run FILE{launch}`."
    )
    text = annotate(recipe_to_toml(loaded.config, header=header), choice.reasons)
    plan_text = render(make_plan(loaded.config, target, with_knobs=False))
    text += "\n" + "\n".join(("# " + line).rstrip() for line in plan_text.splitlines()) + "\n"
    if path is None:
        print(text, end="")
    else:
        path.write_text(text, encoding="utf-8")
        print(plan_text)
        print(f"wrote {output}")
    for problem in compiled.warnings:
        print(f"warning: {problem.format(compiled.source)}", file=sys.stderr)
    return 0
