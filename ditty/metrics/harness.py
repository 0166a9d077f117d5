"""Standard benchmarks through lm-evaluation-harness (the optional `eval` extra: pip install 'ditty[eval]').

Used by `ditty eval RUN_OR_MODEL --tasks ...` and by the trainer for `[eval] harness_tasks` (on the
final model, and every `eval.harness_every` steps on the live one). Scores are reported as
`harness/TASK/METRIC` (a filtered metric as `METRIC_FILTER`), appended to the run's metrics.jsonl
and written into the model card (final/README.md).

The harness gets a loaded model instance, never a path: given a path it would start its own
`accelerate` process group, which inside a ditty run (under torchrun) would wait for every rank.
Tasks are resolved by lm-eval's `TaskManager`; when `include_path` defines every requested task,
the ~15,000 bundled task files are not indexed (that index takes tens of seconds).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from ditty.config.errors import RecipeError
from ditty.metrics.hub_offline import task_data_or_explain

PREFIX = "harness/"


def harness_scores(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[str],
    *,
    include_path: Optional[str] = None,
    limit: Optional[int] = None,
    num_fewshot: Optional[int] = None,
    batch_size: int = 8,
) -> dict[str, float]:
    """{"harness/TASK/METRIC": score} of a loaded causal LM on lm-eval `tasks`."""
    lm_eval = _import_lm_eval()
    from lm_eval.models.huggingface import HFLM

    manager = _task_manager(tasks, include_path)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        raise RecipeError.single(
            f"lm-eval knows no task {', '.join(map(repr, unknown))}",
            key="eval.harness_tasks",
            fix="name tasks lm-eval lists (`lm-eval ls tasks`), or define them in eval.harness_include_path",
        )
    was_training = model.training
    model.eval()
    # simple_evaluate seeds Python's, NumPy's and torch's global generators; a run scored mid-way
    # must keep its own streams (dropout), so they are put back afterwards.
    saved = _random_states()
    try:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
        with task_data_or_explain(tasks):  # no network: the cache, or exit 2 naming the tasks
            results = lm_eval.simple_evaluate(
                model=lm,
                tasks=list(tasks),
                task_manager=manager,
                limit=limit,
                num_fewshot=num_fewshot,
                log_samples=False,
                bootstrap_iters=0,  # no bootstrapped stderr: minutes of resampling for a number not reported
            )
    finally:
        model.train(was_training)
        _restore_random_states(saved)
    return flatten_results(results["results"])


def _random_states() -> tuple:
    import random

    import numpy as np
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _restore_random_states(states: tuple) -> None:
    import random

    import numpy as np
    import torch

    python, numpy_state, cpu, cuda = states
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def flatten_results(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """lm-eval's {task: {"acc,none": 0.5, "acc_stderr,none": ...}} as {"harness/task/acc": 0.5}."""
    out: dict[str, float] = {}
    for task, metrics in results.items():
        for key, value in metrics.items():
            metric, _, kind = key.partition(",")
            if not kind or "_stderr" in metric or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            name = metric if kind == "none" else f"{metric}_{kind}"
            if math.isfinite(float(value)):
                out[f"{PREFIX}{task}/{name}"] = float(value)
    return out


def _import_lm_eval():
    try:
        import lm_eval
    except ImportError:
        raise RecipeError.single(
            "lm-evaluation-harness is not installed",
            key="eval.harness_tasks",
            fix="pip install 'ditty[eval]' (or pip install lm-eval)",
        ) from None
    return lm_eval


def _task_manager(tasks: Sequence[str], include_path: Optional[str]):
    from lm_eval.tasks import TaskManager

    if include_path:
        path = os.path.expanduser(include_path)
        if not os.path.isdir(path):
            raise RecipeError.single(f"{include_path} is not a directory", key="eval.harness_include_path")
        local = TaskManager(include_path=path, include_defaults=False)
        if all(task in local.all_tasks for task in tasks):
            return local
        return TaskManager(include_path=path)
    return TaskManager()


# ------------------------------------------------------------------------------------ a saved model


def resolve_target(path: str) -> tuple[Path, Optional[Path]]:
    """(model directory, run directory or None) for what `ditty eval` was given: a run (its final/,
    or final/merged/ for an adapter run that has one) or a model directory."""
    given = Path(path)
    if (given / "final").is_dir():
        final = given / "final"
        merged = final / "merged"
        return (merged if merged.is_dir() else final), given
    if (given / "config.json").is_file() or (given / "adapter_config.json").is_file():
        return given, None
    raise RecipeError.single(
        f"{path} is neither a run with a final/ model nor a Hugging Face model directory",
        fix="name the output_dir of a finished run, or a directory with config.json (or adapter_config.json)",
    )


def saved_eval_settings(run_dir: Optional[Path], *, given_include_path: Optional[str], trust_code: bool) -> Any:
    """The [eval] section of a run's recipe (None for a model directory), read once final/ is
    verified. Its `harness_include_path` names task files that can run Python (lm-eval's
    `!function`), so it is used only when the user passes `--trust-run-code` or names a path."""
    if run_dir is None:
        return None
    from ditty.checkpoint.integrity import check_model_dir
    from ditty.config.run_recipe import TRUST_FLAG, read_run_recipe

    check_model_dir(run_dir / "final")
    loaded = read_run_recipe(run_dir, trust_code=trust_code)
    if loaded is None:
        return None
    saved = loaded.config.eval
    if saved.harness_include_path and not given_include_path and not trust_code:
        raise RecipeError.single(
            f"{loaded.source} names eval.harness_include_path = {saved.harness_include_path!r}, whose task files "
            "can run Python code; a run directory may come from anyone, so it is not read unless you say so",
            key="eval.harness_include_path",
            fix=f"name the task directory yourself (--include-path DIR), or add {TRUST_FLAG} if you trust that one",
        )
    return saved


def load_model(model_dir: Path) -> tuple[Any, Any]:
    """A saved model and its tokenizer, in evaluation mode; an adapter is merged into its base."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (model_dir / "adapter_config.json").is_file():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(model_dir).merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)


def record_scores(run_dir: Path, scores: dict[str, float], *, step: Optional[int] = None) -> None:
    """Append the scores to the run's metrics.jsonl (at its last step unless `step` is given) and
    rewrite final/README.md (the model card) with them and the last validation metrics."""
    from ditty.metrics.logger import read_metrics

    metrics_path = run_dir / "metrics.jsonl"
    records = read_metrics(str(metrics_path)) if metrics_path.is_file() else []
    if step is None:
        step = max((int(r["step"]) for r in records if isinstance(r.get("step"), int)), default=0)
    with open(metrics_path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, **scores}) + "\n")
    write_card(run_dir, [*records, {"step": step, **scores}])


def write_card(run_dir: Path, records: list[dict[str, Any]]) -> Optional[Path]:
    """final/README.md from the run's recipe and its latest validation and harness figures."""
    from ditty.checkpoint.hub import write_model_card
    from ditty.config.run_recipe import read_run_recipe

    final = run_dir / "final"
    if not final.is_dir():
        return None
    loaded = read_run_recipe(run_dir)  # nothing it names is imported
    config = loaded.config if loaded is not None else None
    latest: dict[str, Any] = {}
    for record in records:
        latest.update(
            {k: v for k, v in record.items() if k.startswith(("val_", PREFIX)) and isinstance(v, (int, float))}
        )
    card = write_model_card(
        final,
        base_model=config.model.path if config is not None else None,
        recipe_text=Path(loaded.source).read_text(encoding="utf-8") if loaded is not None else "",
        metrics=latest,
        adapter=(final / "adapter_config.json").is_file(),
        title=config.run.name if config is not None else None,
    )
    from ditty.checkpoint.manifest import refresh

    refresh(final, [card.name])  # the card is listed in final/'s manifest: readers verify it
    return card


def evaluate_path(
    path: str,
    tasks: Sequence[str],
    *,
    record: bool = True,
    device: str = "cpu",
    verified: bool = False,
    **options: Any,
) -> dict[str, float]:
    """`ditty eval`: score a run's final model (recorded in the run) or a model directory. Its manifest
    is checked first, unless the caller just did (`verified`)."""
    if not tasks:
        raise RecipeError.single("no task to run", fix="ditty eval RUN --tasks hellaswag,arc_easy")
    _import_lm_eval()
    model_dir, run_dir = resolve_target(path)
    from ditty.checkpoint.integrity import check_model_dir

    # Its manifest first (final/'s covers final/merged/): a damaged file is never scored or recorded.
    if not verified:
        check_model_dir(run_dir / "final" if run_dir is not None else model_dir)
    model, tokenizer = load_model(model_dir)
    scores = harness_scores(model.to(device), tokenizer, tasks, **options)
    if record and run_dir is not None:
        record_scores(run_dir, scores)
    return scores


# ------------------------------------------------------------------------------------ during training


def harness_due(eval_config: Any, step: int, last: bool) -> bool:
    """Whether the live model is scored after this step (the final model is scored after saving)."""
    every = eval_config.harness_every
    return bool(eval_config.harness_tasks) and every > 0 and not last and step % every == 0


def harness_options(eval_config: Any) -> dict[str, Any]:
    return dict(
        include_path=eval_config.harness_include_path,
        limit=eval_config.harness_limit,
        num_fewshot=eval_config.harness_num_fewshot,
        batch_size=eval_config.harness_batch_size,
    )


def harness_on_model(model: Any, tokenizer: Any, eval_config: Any) -> dict[str, float]:
    """Rank 0 scores `model` (whole, on its device) while the other ranks wait; {} on those ranks."""
    from ditty._utils.dist import is_main_process

    scores = (
        harness_scores(model, tokenizer, eval_config.harness_tasks, **harness_options(eval_config))
        if (is_main_process())
        else {}
    )
    _barrier()
    return scores


def harness_on_final(final_dir: str, eval_config: Any, device: Any) -> dict[str, float]:
    """Rank 0 loads the saved final model and scores it; the other ranks wait; {} on those ranks."""
    from ditty._utils.dist import is_main_process

    scores: dict[str, float] = {}
    if is_main_process():
        model_dir = Path(final_dir)
        model_dir = model_dir / "merged" if (model_dir / "merged").is_dir() else model_dir
        model, tokenizer = load_model(model_dir)
        scores = harness_scores(model.to(device), tokenizer, eval_config.harness_tasks, **harness_options(eval_config))
    _barrier()
    return scores


def score_final_model(trainer: Any, final_dir: str) -> dict[str, float]:
    """The trainer's `[eval] harness_tasks` on its saved final model: the scores join its latest
    evaluation metrics (so a Hub push carries them) and final/README.md is written with them."""
    from ditty._utils.dist import is_main_process

    scores = harness_on_final(final_dir, trainer.config.eval, trainer.runtime.device)
    trainer.state.eval_metrics.update(scores)
    if is_main_process():
        write_card(Path(trainer.run_dir), [dict(trainer.state.eval_metrics)])
    return scores


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
