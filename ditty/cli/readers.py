"""The commands that read a finished run directory: generate, export, push and eval.

None of them imports code the run's files name (a trainer class, pipeline stages, a model factory)
unless `--trust-run-code` is given; the modules they call check that.
"""

from __future__ import annotations

from pathlib import Path

from ditty.cli.options import refuse_unknown_options, take_option
from ditty.cli.trust import TRUST_FLAG
from ditty.config import RecipeError


def cmd_generate(args: list[str]) -> int:
    max_new, args = take_option(args, ("--max-new-tokens",))
    sample, args = take_option(args, ("--sample",), has_value=False)
    chat, args = take_option(args, ("--chat",), has_value=False)
    tools, args = take_option(args, ("--tools",))
    max_turns, args = take_option(args, ("--max-turns",))
    speculative, args = take_option(args, ("--speculative",))
    _, args = take_option(args, (TRUST_FLAG,), has_value=False)  # generate imports no code either way
    refuse_unknown_options(args, "generate")
    if len(args) != 2:
        raise RecipeError.single(
            "`ditty generate` takes a run directory and a prompt", fix='ditty generate runs/tiny_sft "12+34="'
        )
    run_dir, prompt = args
    if not (Path(run_dir) / "final").is_dir():
        raise RecipeError.single(f"{run_dir} has no final/ model", fix="name the output_dir of a finished run")
    try:
        max_new_tokens = int(max_new) if max_new else 32
    except ValueError:
        raise RecipeError.single("--max-new-tokens takes a whole number") from None
    if max_new_tokens < 1:
        raise RecipeError.single(
            f"--max-new-tokens {max_new_tokens}: it takes a number of tokens of at least 1",
            fix="e.g. --max-new-tokens 32",
        )
    if speculative is not None and (speculative != "mtp" or sample or tools is not None):
        raise RecipeError.single(
            f"--speculative {speculative}: drafts come from the MTP heads (`--speculative mtp`), for greedy text "
            "(not with --sample or --tools)",
            key="--speculative",
            fix=f'ditty generate {run_dir} "PROMPT" --speculative mtp',
        )
    if tools is not None:
        from ditty.train.generate import generate_episode

        turns = _whole_number(max_turns, "--max-turns", 4)
        print(generate_episode(run_dir, prompt, _reference_list(tools), max_new_tokens=max_new_tokens, max_turns=turns))
        return 0
    from ditty.train.generate import generate

    text = generate(
        run_dir, prompt, max_new_tokens=max_new_tokens, sample=bool(sample), chat=bool(chat), speculative=speculative
    )
    print(text)
    return 0


def _reference_list(text: str) -> list[str]:
    """--tools: a list of "package.module:function" (TOML or JSON), or one reference."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = [text]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise RecipeError.single(
            f"--tools {text!r} is not a list of references",
            key="--tools",
            fix="--tools '[\"ditty.objectives.environments.tools.builtin_tools:calculator\"]'",
        )
    return value


def _whole_number(text, flag: str, default: int) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise RecipeError.single(f"{flag} {text}: it takes a whole number of at least 1", key=flag)
    return value


def cmd_export(args: list[str]) -> int:
    output, args = take_option(args, ("-o", "--output"))
    merge, args = take_option(args, ("--merge-lora", "--merge_lora"), has_value=False)
    trust, args = take_option(args, (TRUST_FLAG,), has_value=False)
    refuse_unknown_options(args, "export")
    if len(args) != 1 or output is None:
        raise RecipeError.single(
            "`ditty export` takes a run directory or checkpoint and -o DIR",
            fix="ditty export runs/tiny_sft -o exported/ [--merge-lora]",
        )
    from ditty.cli.export import export

    export(args[0], output, merge_lora=bool(merge), trust_code=bool(trust))
    return 0


def cmd_push(args: list[str]) -> int:
    repo_id, args = take_option(args, ("--repo-id", "--repo_id"))
    _, args = take_option(args, (TRUST_FLAG,), has_value=False)  # push imports no code either way
    refuse_unknown_options(args, "push")
    if len(args) != 1:
        raise RecipeError.single(
            "`ditty push` takes one run directory", fix="ditty push runs/tiny_sft --repo-id me/tiny"
        )
    from ditty.cli.push import push_run

    print(f"pushed: {push_run(args[0], repo_id=repo_id)}")
    return 0


def cmd_eval(args: list[str]) -> int:
    tasks, args = take_option(args, ("--tasks",))
    include_path, args = take_option(args, ("--include-path", "--include_path"))
    limit, args = take_option(args, ("--limit",))
    fewshot, args = take_option(args, ("--num-fewshot", "--num_fewshot"))
    batch_size, args = take_option(args, ("--batch-size", "--batch_size"))
    device, args = take_option(args, ("--device",))
    trust, args = take_option(args, (TRUST_FLAG,), has_value=False)
    refuse_unknown_options(args, "eval")
    if len(args) != 1:
        raise RecipeError.single(
            "`ditty eval` takes one run or model directory",
            fix="ditty eval runs/tiny_sft --tasks hellaswag [--include-path my_tasks/] [--limit 100]",
        )

    def number(text: str | None, flag: str) -> int | None:
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            raise RecipeError.single(f"{flag} takes a whole number, got {text!r}") from None

    given = {
        "limit": number(limit, "--limit"),
        "num_fewshot": number(fewshot, "--num-fewshot"),
        "batch_size": number(batch_size, "--batch-size"),
    }
    from ditty.metrics.harness import resolve_target, saved_eval_settings

    _, run_dir = resolve_target(args[0])
    # A run's [eval] fills in the gaps, read from final/ once final/ is verified; nothing it names is imported.
    saved = saved_eval_settings(run_dir, given_include_path=include_path, trust_code=bool(trust))

    def either(name: str, default):
        return given[name] if given[name] is not None else (getattr(saved, f"harness_{name}") if saved else default)

    if tasks:
        task_list = [task.strip() for task in tasks.split(",") if task.strip()]
    else:
        task_list = list(saved.harness_tasks) if saved else []
    from ditty.metrics.harness import evaluate_path

    scores = evaluate_path(
        args[0],
        task_list,
        device=device or ("cuda" if _cuda() else "cpu"),
        include_path=include_path or (saved.harness_include_path if saved else None),
        limit=either("limit", None),
        num_fewshot=either("num_fewshot", None),
        batch_size=either("batch_size", 8),
        verified=run_dir is not None,  # saved_eval_settings checked final/ a moment ago
    )
    width = max((len(name) for name in scores), default=0)
    for name, value in scores.items():
        print(f"{name.ljust(width)}  {value:.4f}")
    if run_dir is not None:
        print(f"recorded in {run_dir / 'metrics.jsonl'} and {run_dir / 'final' / 'README.md'}")
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
