"""Rules for resuming: whether the checkpoint a run would resume can continue its streams exactly on
this run's ranks. They read the JSON sidecar of that checkpoint (never its weights), so a resume
that cannot continue is refused before anything is built; a run that starts afresh reads nothing
and imports neither ditty.checkpoint nor torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from ditty.config.errors import Problem
from ditty.recipe.rule_base import Context, error, rule


@rule("data.streaming.resume")
def streaming_resume(ctx: Context) -> Iterator[Problem]:
    """A stream's position is per rank and per worker: resuming it on another split is refused."""
    cfg = ctx.config
    if not cfg.data.streaming:
        return
    found, state = _resumed_data_state(cfg)
    if not isinstance(state, dict) or not state.get("streaming"):
        return
    saved = (int(state.get("world_size", 0)), int(state.get("num_workers", 0)))
    if saved != (ctx.world_size, cfg.data.num_workers):
        yield error(
            "data.streaming",
            f"checkpoint {found} streamed on {saved[0]} rank(s) with data.num_workers = {saved[1]}; this run has "
            f"{ctx.world_size} with {cfg.data.num_workers}. Each rank and worker reads its own share of the rows "
            "and keeps its own position, so another split cannot continue the stream exactly",
            f"resume with --nproc-per-node {saved[0]} and data.num_workers = {saved[1]}, or start afresh "
            '(a new run.output_dir, or checkpoint.resume = "never")',
        )


@rule("checkpoint.resume.samples")
def sampled_state_resume(ctx: Context) -> Iterator[Problem]:
    """Rollouts or preference pairs that each rank sampled and had not trained on yet continue only on
    that rank: a checkpoint holding some resumes on its own number of data-parallel ranks (processes,
    without tensor or context parallel)."""
    cfg = ctx.config
    if cfg.rl.kind == "none" and cfg.preference.pairs != "online":  # the streams that sample
        return
    from ditty.objectives.sampling.stream_state import ranks_holding_samples, resume_refusal, resumes_on

    found, state = _resumed_data_state(cfg)
    held = ranks_holding_samples(state)
    # One entry per data-parallel rank: a tensor- or context-parallel group shares its samples.
    if held is not None and not resumes_on(held[0], ctx.data_parallel_size):
        message, fix = resume_refusal(*held, ctx.data_parallel_size)
        yield error("checkpoint.resume", f"checkpoint {found}: {message}", fix)


def _resumed_data_state(cfg: Any) -> tuple[Any, Any]:
    """(the checkpoint this run would resume, its saved data stream state); (None, None) when it
    starts afresh or the checkpoint cannot be read (the run reports that when it plans its resume)."""
    root = Path(cfg.run.output_dir) / "checkpoints"
    if cfg.checkpoint.resume == "never" or (cfg.checkpoint.resume == "auto" and not root.is_dir()):
        return None, None  # without importing ditty.checkpoint (and torch): `ditty check` plans without them
    from ditty.checkpoint import find_checkpoint, latest_complete, read_sidecar
    from ditty.config.errors import RecipeError

    try:
        if cfg.checkpoint.resume == "auto":
            found = latest_complete(root)
        else:
            found = find_checkpoint(cfg.checkpoint.resume)
        return found, read_sidecar(found).get("data") if found is not None else None
    except RecipeError:
        return None, None
