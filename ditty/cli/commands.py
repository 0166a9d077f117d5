"""The `ditty` command line: run, check, init, ls, plot, generate, export, push, eval.

Every user error (a bad recipe, flag, path or data) is a `RecipeError`: printed as a short list,
exit code 2, never a traceback. Exit code 1 is left for bugs and failed training.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
from pathlib import Path
from typing import Callable

from ditty._utils.dist import record_failure, record_stop, record_user_error
from ditty._utils.errors import RunFailure, collective_timeout, interrupted
from ditty._utils.quiet import VERBOSE_ENV, ignore_known_warnings, quiet_libraries
from ditty.cli.init import cmd_init
from ditty.cli.options import refuse_unknown_options, take_option
from ditty.cli.readers import cmd_eval, cmd_export, cmd_generate, cmd_push
from ditty.cli.trust import TRUST_FLAG, import_path, imports_user_code, run_dir_recipe
from ditty.cli.usage import USAGE, command_usage, help_schema, print_help, print_warnings
from ditty.config import RecipeError
from ditty.config.bundled import bundled_recipes
from ditty.config.loader import LoadedRecipe, load_any
from ditty.config.overrides import apply_overrides
from ditty.config.schema import walk_leaves
from ditty.parallel.allocator import cpu_allocator_choice
from ditty.recipe import compile_recipe

LAUNCH_FLAGS = ("--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint")
MODEL_COMMANDS = ("run", "export", "generate", "eval", "push")
"""Commands that load or save a model (and import transformers anyway): its bars are hidden there."""


def _model_bars_quiet(command: str):
    if command not in MODEL_COMMANDS:
        return contextlib.nullcontext()
    from ditty.models.quiet_io import model_bars_quiet

    return model_bars_quiet()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--verbose" in argv:  # the libraries' own start-up messages; workers inherit the variable
        argv.remove("--verbose")
        os.environ[VERBOSE_ENV] = "1"
    quiet_libraries()
    ignore_known_warnings()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if argv[0] in ("-V", "--version"):
        from ditty import __version__

        print(f"ditty {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    handler = COMMANDS.get(command)
    if handler is not None and command not in ("run", "check", "init") and {"-h", "--help"} & set(rest):
        print(command_usage(command), end="")  # the commands without tyro's field list
        return 0
    try:
        if handler is None:
            close = difflib.get_close_matches(command, list(COMMANDS), n=1)
            raise RecipeError.single(
                f"unknown command {command!r}",
                fix=f"did you mean `ditty {close[0]}`?" if close else "see `ditty --help`",
            )
        with import_path(user_code=imports_user_code(command, rest)), _model_bars_quiet(command):
            return handler(rest)
    except RecipeError as error:
        record_user_error(error.format())  # a torchrun worker: the launcher shows this, exit 2
        print(error.format(), file=sys.stderr)
        return 2
    except RunFailure as failure:  # the run stopped for a reason its message explains: no traceback
        record_failure(failure)
        print(f"error: {failure}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ditty check ... | head`: the reader left, nothing more to say
        sys.stderr.close()
        return 0
    except BaseException as error:  # torch.distributed.checkpoint's CheckpointException is not an Exception
        if isinstance(error, (SystemExit, GeneratorExit)):
            raise
        record_failure(error)
        code = _said_without_traceback(error)
        if code is None:
            raise
        return code


def _said_without_traceback(error: BaseException) -> int | None:
    """The exit code of a failure that a message explains (printed here), or None for a traceback."""
    if interrupted(error):  # a second Ctrl-C inside a save, wrapped by torch.distributed.checkpoint
        print(
            "interrupted during a checkpoint save; that save is incomplete and will be removed, the previous "
            "checkpoint is kept (run the same command again to resume from it)",
            file=sys.stderr,
        )
        return 130
    if collective_timeout(error):
        print(
            f"error: {str(error).splitlines()[0][:300]}: a peer stopped answering; DITTY_DIST_TIMEOUT_S sets how "
            "long a collective waits",
            file=sys.stderr,
        )
        return 1
    return None


# --- shared pieces -----------------------------------------------------------------------------


def _launch_options(args: list[str]) -> tuple[dict[str, str], list[str]]:
    options = {}
    for flag in LAUNCH_FLAGS:
        value, args = take_option(args, (flag, flag.replace("-", "_")))
        if value is not None:
            options[flag.lstrip("-")] = value
    return options, args


def _world_size(options: dict[str, str]) -> int:
    try:
        return int(options.get("nproc-per-node", "1")) * int(options.get("nnodes", "1"))
    except ValueError:
        raise RecipeError.single(
            "--nproc-per-node and --nnodes take whole numbers", fix="e.g. --nproc-per-node 2"
        ) from None


def _recipe_and_flags(args: list[str], command: str) -> tuple[str, list[str]]:
    if not args or args[0].startswith("-"):
        # Flags come in pairs with their values: a word left over at the end is a recipe given late.
        if len(args) % 2 == 1 and not args[-1].startswith("-"):
            raise RecipeError.single(
                f"`ditty {command}` takes the recipe first, before its flags (found {args[-1]!r} last)",
                fix=f"ditty {command} {args[-1]} {' '.join(args[:-1])}",
            )
        raise RecipeError.single(f"`ditty {command}` needs a recipe", fix=f"ditty {command} RECIPE (see `ditty ls`)")
    return args[0], args[1:]


def _load(ref: str, flags: list[str]) -> LoadedRecipe:
    return apply_overrides(load_any(ref), flags)


# --- commands ------------------------------------------------------------------------------------


def cmd_run(args: list[str]) -> int:
    if "LOCAL_RANK" in os.environ:  # a torchrun worker: stop (and save) when the launcher dies
        from ditty.parallel.launch import die_with_launcher

        die_with_launcher()
    if any(a in ("-h", "--help") for a in args):
        return print_help(help_schema(args), "ditty run RECIPE")
    launch_options, args = _launch_options(args)
    ref, flags = _recipe_and_flags(args, "run")
    loaded = _load(ref, flags)
    cpu_allocator_choice()  # a typo in DITTY_CPU_ALLOCATOR stops here, on any device
    # Inside a torchrun worker the world comes from the environment.
    world_size = int(os.environ.get("WORLD_SIZE", "0")) or _world_size(launch_options)
    plan = compile_recipe(loaded, world_size=world_size)
    print_warnings(plan)
    plan.raise_for_errors()
    if world_size > 1 and "LOCAL_RANK" not in os.environ:
        # The recipe compiled for the whole world; now torchrun starts the workers, each of
        # which runs `python -m ditty run` with the same recipe and flags.
        from ditty.parallel.allocator import worker_environment
        from ditty.parallel.env import resolve_device
        from ditty.parallel.launch import launch

        device = resolve_device(loaded.config.run.device)
        return launch(
            ["run", ref, *flags],
            nproc_per_node=int(launch_options.get("nproc-per-node", "1")),
            nnodes=int(launch_options.get("nnodes", "1")),
            node_rank=int(launch_options.get("node-rank", "0")),
            rdzv_endpoint=launch_options.get("rdzv-endpoint"),
            worker_env=worker_environment(device.type, loaded.config.parallel.kind, world_size),
        )
    from ditty.train.entry import run_training

    result = run_training(loaded, plan)
    # Preempted (SIGTERM/SIGINT) after saving a checkpoint: the shell's convention, 128 + signal.
    if result.stopped_by:
        record_stop(f"stopped by signal {result.stopped_by} after step {result.steps}")
        from ditty.parallel.launch import LAUNCHER_PID_ENV

        if os.environ.get(LAUNCHER_PID_ENV):
            # A worker of ditty's launcher: exit 0 so that torchrun, which takes any other code for a
            # crash and kills the peers still saving, waits for all of them; the launcher reads the
            # stop records and exits 128 + signal itself.
            return 0
        return 128 + result.stopped_by
    return 0


def cmd_check(args: list[str]) -> int:
    if any(a in ("-h", "--help") for a in args):
        return print_help(help_schema(args), "ditty check RECIPE")
    explain, args = take_option(args, ("--explain",), has_value=False)
    trust, args = take_option(args, (TRUST_FLAG,), has_value=False)
    plan_options, args = _plan_options(args)
    launch, args = _launch_options(args)
    ref, flags = _recipe_and_flags(args, "check")
    run_recipe = run_dir_recipe([ref])
    if run_recipe is not None:  # a run's recipe: parsed without importing what it names
        from ditty.config.run_recipe import parse_run_recipe, refuse_run_code

        read = parse_run_recipe(run_recipe.read_bytes(), str(run_recipe), trust_code=bool(trust))
        refuse_run_code(read, needs="checking it", trust_code=bool(trust))
        loaded = apply_overrides(read, flags)
    else:
        loaded = _load(ref, flags)
    cpu_allocator_choice()  # the environment a run would start with (ditty.parallel.allocator)
    from ditty.cli import memory_plan as cli_plan

    target = cli_plan.plan_target(plan_options, launch, loaded.config) if plan_options else None
    plan = compile_recipe(loaded, world_size=target.world_size if target else _world_size(launch))
    print(f"recipe {plan.source or ref}" + (f" (trainer {loaded.trainer})" if loaded.trainer else ""))
    print(plan.summary())
    if explain:
        print(explain_values(loaded))
    print_warnings(plan)
    if plan.errors:
        raise RecipeError(plan.errors, source=plan.source)
    from ditty.plan.groups import describe_groups

    print(describe_groups(loaded.config))
    if target is not None:
        cli_plan.print_training_plan(loaded, target, plan_options.get("probe"))
    print("ok: the recipe is valid" + (f" ({len(plan.warnings)} warning(s))" if plan.warnings else ""))
    return 0


# --- `ditty check --plan` and `ditty init --method`: ditty/plan ---------------------------------

PLAN_FLAGS = ("--gpus", "--gpu-memory", "--nodes", "--probe")


def _plan_options(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """`--plan` and its options; an option without `--plan` is a mistake worth saying."""
    wanted, args = take_option(args, ("--plan",), has_value=False)
    options: dict[str, str] = {}
    for flag in PLAN_FLAGS:
        value, args = take_option(args, (flag, flag.replace("-", "_")))
        if value is not None:
            options[flag.lstrip("-")] = value
    if options and not wanted:
        raise RecipeError.single(
            f"--{next(iter(options))} belongs to --plan", fix="add --plan: ditty check RECIPE --plan --gpus 8"
        )
    return ({"plan": "true", **options} if wanted else {}), args


def explain_values(loaded: LoadedRecipe) -> str:
    """Every field with its value and where the value came from."""
    from ditty.config.writer import format_value

    rows = []
    for leaf in walk_leaves(type(loaded.config)):
        value = loaded.config
        for part in leaf.path.split("."):
            value = getattr(value, part)
        origin = loaded.provenance.get(leaf.path, "default")
        if origin == "toml":
            line = loaded.lines.line_of(leaf.path)
            origin = f"toml, line {line}" if line else "toml"
        shown = "(not set)" if value is None else format_value(value)
        rows.append((leaf.path, shown, origin))
    width = max(len(path) for path, _, _ in rows)
    value_width = min(40, max(len(shown) for _, shown, _ in rows))
    return "\n".join(f"  {path.ljust(width)} = {shown.ljust(value_width)}  [{origin}]" for path, shown, origin in rows)


def cmd_ls(args: list[str]) -> int:
    if args:
        raise RecipeError.single(f"`ditty ls` takes no arguments, got {' '.join(args)}", fix="ditty ls")
    recipes = bundled_recipes()
    width = max((len(r.name) for r in recipes), default=0)
    for recipe in recipes:
        print(f"{recipe.name.ljust(width)}  {recipe.description}")
    return 0


def cmd_plot(args: list[str]) -> int:
    refuse_unknown_options(args, "plot")
    if len(args) != 1:
        raise RecipeError.single("`ditty plot` takes one run directory", fix="ditty plot runs/tiny_sft")
    run_dir = Path(args[0])
    if not (run_dir / "metrics.jsonl").is_file():
        raise RecipeError.single(f"{run_dir} holds no metrics.jsonl", fix="name the output_dir of a ditty run")
    if not (run_dir / "recipe.toml").is_file():  # curves.png there would be somebody else's file
        raise RecipeError.single(
            f"{run_dir} is not a ditty run directory (it has no recipe.toml), so its curves.png is not ditty's to "
            "replace",
            fix="name the output_dir of a ditty run",
        )
    from ditty.metrics.logger import load_metrics
    from ditty.metrics.plot import plot_run

    records, skipped = load_metrics(str(run_dir))
    if not records:
        raise RecipeError.single(
            f"{run_dir}/metrics.jsonl holds no readable record ({skipped} unreadable lines): there is nothing to plot",
            fix="plot a run that has logged at least one step",
        )
    note = f" (skipped {skipped} unreadable line{'s' if skipped != 1 else ''} of metrics.jsonl)" if skipped else ""
    print(f"wrote {plot_run(str(run_dir), records=records)}{note}")
    return 0


def cmd_rollout_server(args: list[str]) -> int:
    from ditty.cli.rollout_server import cmd_rollout_server as serve

    return serve(args)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": cmd_run,
    "check": cmd_check,
    "init": cmd_init,
    "ls": cmd_ls,
    "plot": cmd_plot,
    "generate": cmd_generate,
    "export": cmd_export,
    "push": cmd_push,
    "eval": cmd_eval,
    "rollout-server": cmd_rollout_server,
}
