"""What a compiled recipe will do: derived numbers, the components to build, and the problems."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ditty.config.errors import Problem, RecipeError


@dataclass
class Plan:
    config: Any
    world_size: int = 1
    data_parallel_size: int = 1
    accumulation_steps: int | None = None
    steps: int | None = None
    """Optimizer steps, when known before the data is read (set directly, or a built-in dataset)."""
    tokens_per_step: int | None = None
    """Upper bound: global batch x max_seq_len (padding and short samples make it smaller)."""
    builds: list[tuple[str, str]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    source: str | None = None

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    def raise_for_errors(self) -> None:
        if self.errors:
            raise RecipeError(self.errors, source=self.source)

    def summary(self) -> str:
        cfg = self.config
        train = cfg.train
        rows = [
            ("world size", f"{self.world_size} ({cfg.parallel.kind}, data-parallel size {self.data_parallel_size})"),
            (
                "global batch",
                f"{train.global_batch_size} samples = micro {train.micro_batch_size} x accumulation "
                f"{self.accumulation_steps if self.accumulation_steps is not None else '?'} x data-parallel "
                f"{self.data_parallel_size}",
            ),
            (
                "steps",
                str(self.steps)
                if self.steps is not None
                else f"{train.epochs:g} epoch(s), counted once the data is read",
            ),
            ("tokens per step", f"at most {self.tokens_per_step:,}" if self.tokens_per_step else "?"),
            ("precision", f"{train.precision} (weights stored as {cfg.model.dtype})"),
        ]
        rows += self.builds
        width = max(len(name) for name, _ in rows)
        lines = [f"  {name.ljust(width)}  {value}" for name, value in rows]
        return "\n".join(lines)
