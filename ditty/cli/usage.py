"""What `ditty --help` and `ditty COMMAND --help` print: the command list, and for run, check and
init every field of the recipe's schema (through tyro), with the launch flags."""

from __future__ import annotations

import sys
from typing import Any

from ditty.config import TrainerConfig
from ditty.config.loader import load_any
from ditty.config.schema import walk_leaves

USAGE = """\
usage: ditty COMMAND [ARGS]

commands:
  run RECIPE [--section.field VALUE ...]      compile the recipe, then train
        [--nproc-per-node N [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT]]
                                              ... on N processes per node (torchrun)
  check RECIPE [flags] [--explain]            compile only and print the plan
        [--plan [--gpus N] [--gpu-memory 80GB] [--nodes M] [--probe N]]
                                              ... with the per-rank memory and time plan
  init [--section.field VALUE ...] [-o FILE [--force]]
                                              write a complete, commented recipe
  init --model ID --method full|lora|qlora --gpus N --gpu-memory 24GB [--data PATH] [--seq-len L]
                                              a recipe chosen to fit, with its plan
  ls                                          list the bundled recipes
  plot RUN_DIR                                redraw a run's curves.png from metrics.jsonl
  generate RUN_DIR PROMPT [--max-new-tokens N] [--sample] [--chat] [--tools LIST [--max-turns N]]
        [--speculative mtp]
                                              text from a run's final model (--chat: the
                                              prompt as a user turn in its chat template;
                                              --tools: an episode that calls those functions;
                                              --speculative mtp: greedy, drafted by the MTP heads)
  export RUN_OR_CHECKPOINT -o DIR [--merge-lora]
                                              a checkpoint as a Hugging Face model
  push RUN_DIR [--repo-id ID]                 push a finished run's model and card to the Hub
  eval RUN_OR_MODEL --tasks T1,T2 [--include-path DIR] [--limit N] [--num-fewshot K]
                                              lm-evaluation-harness scores (recorded in a run)
  rollout-server RECIPE [flags] [--print-command]
                                              the vLLM server of rollout.backend = "vllm-server"

RECIPE is a .toml path, the name of a bundled recipe (see `ditty ls`), or
package.module:function returning a Trainer.Config. `ditty run --help` lists every field.
--verbose (any command) shows the libraries' own start-up messages and warnings.
"""

LAUNCH_HELP = """launching (run and check):
  --nproc-per-node N      processes on this node (torchrun); the recipe compiles first
  --nnodes M              nodes in all (default 1)
  --node-rank R           this node's rank, 0..M-1
  --rdzv-endpoint H:P     host:port of node 0, reachable from every node (several nodes)
  --verbose               the libraries' own start-up messages and warnings
"""


INIT_HELP = """writing a recipe (init):
  -o FILE                 write it to FILE (else print it); FILE must not exist
  --force                 replace an existing FILE
  --model ID --method full|lora|qlora --gpu-memory 24GB [--gpus N] [--nodes M]
      [--data PATH] [--seq-len L] [--global-batch B]
                          choose a recipe that fits that machine, and print its plan
  --section.field VALUE   any field below, on top of the starter (or the chosen) recipe
"""


def command_usage(command: str) -> str:
    """The lines of USAGE that describe `command`, under a usage heading."""
    lines = USAGE.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {command} "))
    end = start + 1
    while end < len(lines) and lines[end].startswith("        "):
        end += 1
    return "usage: ditty " + "\n".join(lines[start:end]).strip() + "\n"


def print_help(schema: type, prog: str) -> int:
    import tyro

    if prog.startswith(("ditty run", "ditty check")):
        print(LAUNCH_HELP)
    if prog.startswith("ditty init"):
        print(INIT_HELP)
    try:
        tyro.cli(
            schema,
            args=["--help"],
            prog=prog,
            config=(tyro.conf.FlagConversionOff,),
            description="Every field of the recipe, as --section.field VALUE (values are TOML: "
            'true/false, numbers, "strings", [lists], {tables}).',
        )
    except SystemExit:
        pass
    from ditty.config.overrides import tyro_handles
    from ditty.config.schema import type_name

    others = [leaf for leaf in walk_leaves(schema) if not tyro_handles(leaf.type)]
    if others:
        print("\nfields that take a TOML table or list value:")
        for leaf in others:
            print(f"  --{leaf.path} {type_name(leaf.type).upper()}\n      {leaf.doc}")
    return 0


def help_schema(args: list[str]) -> type:
    """The schema `--help` describes: the named recipe's trainer Config, else Trainer.Config."""
    if args and not args[0].startswith("-"):
        return type(load_any(args[0]).config)
    return TrainerConfig


def print_warnings(plan: Any) -> None:
    """The compiler's warnings of a plan, on stderr (run, check, init and rollout-server print them)."""
    for problem in plan.warnings:
        print(f"warning: {problem.format(plan.source)}", file=sys.stderr)
