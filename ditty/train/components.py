"""`RuntimeComponents`: Python objects handed to the Trainer beside its config.

A recipe (TOML) can only name things ("package.module:function"); a Python user has the things
themselves: a model instance, a dataset, a collate function, processor and loss instances. Each
field given here replaces what the Trainer would build from the matching config section, and
nothing else changes: the same loop, batch semantics and run directory. `ditty.pipeline.Pipeline`
fills this in; a script may also pass it directly: `Trainer(config, components=RuntimeComponents(...))`.

Such a run cannot be re-created from its recipe.toml alone; `annotate_recipe` says so at the top
of the file and lists each object by type (`# model: <python object MyNet>`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

SECRET_FIELDS = ("hub_token",)


@dataclass
class RuntimeComponents:
    model: Any = None
    """An nn.Module instance (replaces [model]); [peft] adapters still apply to it."""
    dataset: Any = None
    """Training samples: any indexable dataset (replaces [data]); collated by `collate_fn`."""
    val_dataset: Any = None
    """Validation samples, evaluated as val_loss (optional)."""
    dataloader: Any = None
    """A ready DataLoader instead of `dataset`: each of its batches is one micro-batch."""
    collate_fn: Optional[Callable[[list], Any]] = None
    """Turns a list of samples into a batch (default: torch's default_collate)."""
    preprocessors: Optional[list] = None
    """PreProcessor instances (replace [[pipeline.preprocessors]])."""
    postprocessors: Optional[list] = None
    """PostProcessor instances (replace [[pipeline.postprocessors]])."""
    loss: Any = None
    """A LossCalculator instance (replaces [[pipeline.loss]])."""
    task: Any = None
    """An evaluation hook for generic data (see ditty.data.generic.GenericTask)."""
    tokenizer: Any = None
    """A tokenizer (replaces [tokenizer]), e.g. `TokenizerFactory(path).build()`: it encodes task rows
    and is saved into final/ with the model."""
    optimizer: Any = None
    """A torch optimizer over the model's trainable parameters (replaces [optimizer]); checked by
    ditty.optim.given (it cannot hold LoRA adapters or FSDP shards made after it)."""
    metrics_logger: Any = None
    """An object with `log_scalar(tag, value, step)` (ditty.MetricsLogger) that gets every logged
    record too, on rank 0 (ditty.metrics.user_logger.attach_user_logger)."""
    converters: Optional[list] = None
    """Model converters (e.g. a ModelTransform) applied before the configured ones ([peft], [fp8])."""
    reward_functions: Optional[list] = None
    """Reward functions for [rl] (replace rl.rewards): TRL-signature callables fn(prompts,
    completions, **columns), or the original library's reward_fn(task, completion_text), which is
    wrapped in ditty.objectives.rewards.functions.TaskReward."""
    hub_token: Optional[str] = field(default=None, repr=False)
    """Hugging Face token for the [hub] push; held in memory only, never written anywhere."""

    def given(self) -> dict[str, Any]:
        """The fields that hold an object (an empty list of processors counts as given too); never
        the hub token."""
        values = {f.name: self.__dict__[f.name] for f in fields(self)}
        return {name: value for name, value in values.items() if value is not None and name not in SECRET_FIELDS}

    @property
    def has_data(self) -> bool:
        return self.dataset is not None or self.dataloader is not None

    def replaced_sections(self) -> tuple[str, ...]:
        """Recipe sections (as key prefixes) these objects stand in for: the compiler leaves their
        problems out, since their defaults are nobody's choice."""
        sections = []
        if self.model is not None:
            sections.append("model.")
        if self.has_data:
            sections += ["data.", "tokenizer."]
        if self.reward_functions:
            sections.append("rl.reward")
        return tuple(sections)


def describe(value: Any, *, each: bool = False) -> str:
    """`<python object MyNet>` as recorded in recipe.toml; `each` lists a list's items (processors)."""
    if each and isinstance(value, (list, tuple)):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    name = getattr(value, "__qualname__", None) if callable(value) and not hasattr(value, "forward") else None
    name = name or type(value).__qualname__
    sized = getattr(value, "dataset", value)  # a DataLoader's len() counts batches: count its dataset's samples
    try:
        countable = (
            hasattr(sized, "__len__") and not isinstance(sized, (str, bytes, dict)) and not hasattr(sized, "forward")
        )
        size = f" of {len(sized)} samples" if countable else ""
    except TypeError:
        size = ""
    return f"<python object {name}{size}>"


def annotate_recipe(run_dir: str, components: RuntimeComponents) -> None:
    """Prepend to recipe.toml which parts of the run came from Python objects (rank 0 calls it)."""
    given = components.given()
    path = os.path.join(run_dir, "recipe.toml")
    if not given or not os.path.exists(path):
        return
    lines = [
        "# This run was built from Python objects (ditty.pipeline.Pipeline or RuntimeComponents):",
        "# it is NOT re-runnable from this file alone. The objects, which replace the sections below:",
    ]
    lines += [f"# {name}: {describe(value, each=name.endswith('processors'))}" for name, value in given.items()]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n\n" + text)
