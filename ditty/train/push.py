"""Pushing to the Hugging Face Hub from a training run (`hub.push = "end"` or "checkpoints"), and the
model card of final/ (`ditty push RUN_DIR` of a finished run is ditty.cli.push).

The repository and its privacy come from the recipe's `[hub]`; the card (README.md in final/) is
written from the recipe and the run's evaluation; the token is huggingface_hub's (HF_TOKEN or the
login cache, or the Python API's hf_hub_token) and is written nowhere. A failed push is reported,
never raised: every local file is kept.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, Any, Optional

from ditty._utils.dist import is_main_process
from ditty.config.errors import RecipeError

if TYPE_CHECKING:
    from ditty.train.state import TrainRun, TrainState


def card_fields(config: Any, recipe_text: str, metrics: dict, *, task: str) -> dict[str, Any]:
    """The model card's arguments (ditty.checkpoint.hub.model_card_text) for a run of `config` (or None)."""
    from ditty.models.tasks import model_task

    found = model_task(task)
    return dict(
        base_model=config.model.path if config is not None else None,
        recipe_text=recipe_text,
        metrics={k: v for k, v in metrics.items() if isinstance(v, (int, float))},
        title=config.run.name if config is not None else None,
        task=found.name,
        pipeline_tag=found.pipeline_tag,
        auto_class=found.auto_class,
        pipeline=found.pipeline,
        peft_auto_class=found.peft_auto_class,
    )


def _recipe_text(run_dir: str) -> str:
    path = os.path.join(run_dir, "recipe.toml")
    return open(path, encoding="utf-8").read() if os.path.isfile(path) else ""


def push_to_hub(run: "TrainRun", folder: str, *, message: str) -> Optional[str]:
    """Push `folder` to `hub.repo_id` with a model card (rank 0). A failure is reported, not raised:
    training succeeded and every local file is kept; the message says how to retry."""
    from ditty.checkpoint.hub import model_card_text, push_folder

    cfg = run.config
    if not is_main_process() or not cfg.hub.repo_id:
        return None
    try:
        card = {}
        if not has_ditty_card(folder):  # final/'s own card is in its manifest and travels as it is
            fields = card_fields(cfg, _recipe_text(run.run_dir), run.state.eval_metrics, task=cfg.model.task)
            text = model_card_text(folder, adapter=cfg.peft.kind != "none", **fields)
            card = {"README.md": text.encode("utf-8")}  # in the commit only: the folder stays as written
        return push_folder(
            folder,
            repo_id=cfg.hub.repo_id,
            private=cfg.hub.private,
            commit_message=message,
            run_dir=run.run_dir,
            extra_files=card,
            token=run.hub_token,  # Pipeline(hf_hub_token=)
        )
    except RecipeError as e:
        print(f"warning: {e.format()}", flush=True)
        return None


def has_ditty_card(folder: str) -> bool:
    """Whether `folder` already holds ditty's model card (final/ of a run writes one, listed in its
    manifest; rewriting it would make final/ read as damaged)."""
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as handle:
        return "\n- ditty\n" in handle.read(4096)


def final_model_card(cfg: Any, run_dir: str, state: "TrainState"):
    """A writer of final/README.md, ditty's model card (task, base, method, data, metrics, how to load
    it, the recipe), called with the folder being written; peft's template would say only
    "[More Information Needed]"."""
    from ditty.checkpoint.hub import write_model_card

    if cfg.model.resolved_init == "random":
        method = "trained from scratch (random init)"
    elif cfg.peft.kind == "none":
        method = "full finetune"
    else:
        method = f"{cfg.peft.kind} adapter (r {cfg.peft.r}, alpha {cfg.peft.alpha:g})"
        method += f" on a {cfg.quant.kind} base" if cfg.quant.kind != "none" else ""
    from ditty.objectives.table import objective_for

    method += objective_for(cfg).card(cfg)
    data = cfg.data
    where = {"builtin": f"built-in `{data.name}`", "file": f"`{data.path}`"}.get(data.source, f"`{data.source}`")
    facts = {
        "task": f"`{cfg.model.task}`",
        "method": method,
        "data": f"{where} ({data.format}, sequences up to {data.max_seq_len} tokens)",
        "steps": str(state.step),
    }
    fields = card_fields(cfg, _recipe_text(run_dir), state.eval_metrics, task=cfg.model.task)
    return lambda folder: write_model_card(folder, adapter=cfg.peft.kind != "none", facts=facts, **fields)


def push_checkpoint_snapshot(run: "TrainRun") -> None:
    """`hub.push = "checkpoints"`: the current model in Hugging Face format, pushed, then removed.
    Collective under FSDP (the full state dict is gathered shard by shard, kept on rank 0)."""
    from ditty.train.final import save_final

    if not run.config.hub.repo_id:
        return
    full = run.engine.full_state_dict(run.model)
    if not is_main_process():
        return
    staging = os.path.join(run.run_dir, ".hub-staging")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    try:
        folder = save_final(run.model, run.tokenizer, staging, state_dict=full)
        push_to_hub(run, folder, message=f"ditty: step {run.state.step}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
