"""`ditty push RUN_DIR [--repo-id ID]`: a finished run's final model or adapter, with a model card.

The repository and its privacy come from the run's recipe.toml (`[hub]`) unless `--repo-id` names
one. The card is written from the recipe and the last evaluation in metrics.jsonl, unless final/
already holds ditty's own; the token is huggingface_hub's (HF_TOKEN or the login cache) and is
written nowhere. Any failure is a RecipeError (exit code 2) that keeps every file and names this
command to retry.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ditty.config.errors import RecipeError
from ditty.train.push import card_fields, has_ditty_card


def _last_eval(run_dir: str) -> dict[str, Any]:
    from ditty.metrics.logger import read_metrics

    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return {}
    records = read_metrics(path)
    out: dict[str, Any] = {}
    harness: dict[str, Any] = {}
    for record in records:
        if any(k.startswith("val_") for k in record):
            out = {k: v for k, v in record.items() if k.startswith("val_") and isinstance(v, (int, float))}
        # lm-eval scores (ditty.metrics.harness) arrive in records of their own; the latest of each counts.
        harness.update({k: v for k, v in record.items() if k.startswith("harness/") and isinstance(v, (int, float))})
    out.update(harness)
    losses = [r["loss"] for r in records if isinstance(r.get("loss"), (int, float))]
    if losses:
        out = {"loss": losses[-1], **out}
    return out


def push_run(run_dir: str, *, repo_id: Optional[str] = None) -> str:
    from ditty.checkpoint.hub import model_card_text, push_folder
    from ditty.config.run_recipe import read_run_recipe
    from ditty.train.final import final_model_task

    final = os.path.join(run_dir, "final")
    if not os.path.isdir(final):
        raise RecipeError.single(
            f"{run_dir} has no final/ model to push",
            fix="push the output_dir of a finished run (or let it finish: `ditty run` resumes it)",
        )
    from ditty.checkpoint.integrity import check_model_dir

    check_model_dir(final)  # never push a damaged model
    loaded = read_run_recipe(run_dir)  # final/'s copy, verified above; nothing it names is imported
    config = loaded.config if loaded is not None else None
    # The same command again, with the repository it was given: the run's recipe may name none.
    retry = f"ditty push {run_dir} --repo-id {repo_id}" if repo_id else f"ditty push {run_dir}"
    repo_id = repo_id or (config.hub.repo_id if config is not None else None)
    if not repo_id:
        raise RecipeError.single(
            f"no Hub repository for {run_dir}", key="hub.repo_id", fix=f"ditty push {run_dir} --repo-id you/model-name"
        )
    recipe_text = open(loaded.source, encoding="utf-8").read() if loaded is not None else ""
    card = {}
    if not has_ditty_card(final):  # final/'s own card is in its manifest and travels as it is
        fields = card_fields(config, recipe_text, _last_eval(run_dir), task=final_model_task(run_dir).name)
        adapter = os.path.isfile(os.path.join(final, "adapter_config.json"))
        card = {"README.md": model_card_text(final, adapter=adapter, **fields).encode("utf-8")}  # the commit only
    return push_folder(
        final,
        repo_id=repo_id,
        private=config.hub.private if config is not None else True,
        commit_message="ditty: final model",
        run_dir=run_dir,
        extra_files=card,
        retry=retry,
    )
