"""The recipe sections for what a run writes and reports: checkpoints (`[checkpoint]`), the Hub
(`[hub]`), logging (`[logging]`) and lm-evaluation-harness scores (`[eval]`).

Like every section (see ditty/config/sections.py), each field's attribute docstring is its help text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 0
    """Save a checkpoint every this many steps (0: by the clock only, `every_minutes`)."""
    every_minutes: float = 10.0
    """Also save when this many minutes of training passed since the last checkpoint, so a crash or a
    kill -9 (where no signal handler can save) loses at most this much (0: off). Read at log steps."""
    keep_last: int = 2
    """Keep this many newest checkpoints (0 keeps all)."""
    async_save: bool = False
    """Write checkpoints in the background."""
    resume: str = "auto"
    """"auto" (newest complete checkpoint in the run directory), "never", or a checkpoint path."""
    force_resume: bool = False
    """Resume even when the recipe differs from the checkpoint's in keys that change training, or a
    data file's content differs from the one the checkpoint recorded (the differences are logged)."""
    final_format: Literal["auto", "merged"] = "auto"
    """"auto": full model, or the adapter for adapter runs, with a merged full model in final/merged/
    for an adapter of a classifier (what transformers.pipeline loads with the label names); "merged":
    also a merged full model for every adapter run."""
    fallback: bool = True
    """resume = "auto": when the newest checkpoint fails verification (a changed, truncated or missing
    file), resume from the newest intact one and say which were skipped (true), or stop with an error (false)."""
    overwrite_finished: bool = False
    """Let a run into a run.output_dir that holds a finished run (final/) replace its final/,
    recipe.toml and metrics: start it again, or train it further. Off, such a run stops (exit 2)
    naming what it would replace. Asked each time: the run's recipe.toml records it as false."""


@dataclass(frozen=True)
class HubConfig:
    repo_id: Optional[str] = None
    """Hub repository to push to, e.g. "me/my-model"."""
    private: bool = True
    """Create the repository as private."""
    push: Literal["never", "end", "checkpoints"] = "never"
    """When to push: never, at the end, or at every checkpoint."""


@dataclass(frozen=True)
class LoggingConfig:
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = False
    """Write TensorBoard event files into the run directory."""
    wandb: bool = False
    """Log to Weights & Biases (extra `wandb`)."""
    wandb_project: Optional[str] = None
    """Weights & Biases project name."""
    peak_tflops: Optional[float] = None
    """Peak dense TFLOP/s of one device, the denominator of the `mfu` metric. Unset: from ditty's
    table of accelerators (H100, H200, A100, L4, ...) for train.precision; on a CPU, measured once
    per machine by a short fp32 matrix-product probe and cached."""


@dataclass(frozen=True)
class EvalConfig:
    harness_tasks: list[str] = field(default_factory=list)
    """lm-evaluation-harness tasks run on the final model (the `eval` extra: pip install 'ditty[eval]'),
    e.g. ["hellaswag"]; scores go to metrics.jsonl and the model card."""
    harness_every: int = 0
    """Also run the tasks on the model every this many steps (0: only on the final model)."""
    harness_include_path: Optional[str] = None
    """A directory of your own lm-eval task YAML files (tasks defined locally, no download)."""
    harness_limit: Optional[int] = None
    """Score at most this many documents per task (unset: all of them)."""
    harness_num_fewshot: Optional[int] = None
    """Few-shot examples per prompt (unset: each task's own default)."""
    harness_batch_size: int = 8
    """Requests per forward pass of the harness."""
