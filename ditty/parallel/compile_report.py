"""What torch.compile made of a run's model: the graphs dynamo compiled and the graph breaks it hit.

A graph break inside a checkpointed block, or a block dynamo cannot trace at all, does not fail:
dynamo runs that code eagerly and training goes on at eager speed. So a run that asked for
`train.compile` reads dynamo's process-wide counters (`torch._dynamo.utils.counters`) after its
first step, where the lazy compile happens, and says when it fell back (`CompileReport.fell_back`),
with dynamo's own reason; the run summary gives the counts either way.

The counters are global to the process (a Python API user may run several trainers), so a watch
counts from the moment the model was compiled, not from zero.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


def _break_counts() -> Counter:
    from torch._dynamo.utils import counters

    return Counter(dict(counters["graph_break"]))


def _graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@dataclass(frozen=True)
class CompileReport:
    graphs: int
    """Graphs dynamo compiled since the model was compiled."""
    breaks: int
    """Graph breaks since then (dynamo counts one per traced frame that broke)."""
    reasons: list[str] = field(default_factory=list)
    """Dynamo's reasons for the breaks, shortened, the most frequent first."""
    units: int = 1
    """What was compiled: the number of blocks, or 1 for the whole model."""

    @property
    def fell_back(self) -> bool:
        """No graph at all, or at least as many breaks as compiled units: much or all of the model
        runs eagerly. A few breaks in a model of many blocks are left alone."""
        return self.graphs == 0 or self.breaks >= self.units

    def counts(self) -> str:
        breaks = f", {self.breaks} graph break{'s' * (self.breaks != 1)}" if self.breaks else ""
        return f"{self.graphs} graph{'s' * (self.graphs != 1)} compiled{breaks}"

    def summary(self) -> str:
        """The run summary's line."""
        return f"torch.compile: {self.counts()}"

    def warning(self, activation_checkpointing: str) -> str:
        """The one-time warning of a run that fell back, with the key to change."""
        reason = self.reasons[0] if self.reasons else "dynamo gave no reason"
        if activation_checkpointing != "none":
            # Dynamo cannot split a checkpointed region: one break inside a block runs all of it eagerly.
            fix = (
                'set train.activation_checkpointing = "none" (a graph break inside a checkpointed block runs '
                "the whole block eagerly), or train.compile = false to skip the compile time"
            )
        else:
            fix = 'set train.compile_scope = "model" or "blocks" (the other one), or train.compile = false'
        speed = "this run trains at eager speed" if self.graphs == 0 else "much of the model runs eagerly"
        return (
            f"train.compile = true, but torch.compile fell back to eager: {self.counts()} "
            f"({self.units} compiled unit{'s' * (self.units != 1)}), so {speed}. "
            f"Dynamo's reason: {reason}. To change it, {fix}."
        )


class CompileWatch:
    """Counts what dynamo compiles from now on, for `units` compiled blocks (or 1 whole model)."""

    def __init__(self, units: int):
        self.units = max(1, units)
        self._graphs = _graph_count()
        self._breaks = _break_counts()

    def report(self) -> CompileReport:
        breaks = _break_counts() - self._breaks
        return CompileReport(
            graphs=_graph_count() - self._graphs,
            breaks=sum(breaks.values()),
            reasons=[short_reason(text) for text, _ in breaks.most_common()],
            units=self.units,
        )


def short_reason(text: str) -> str:
    """Dynamo's multi-line reason as one line: its title, explanation and debug context."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return text
    keep = [lines[0]]
    for line in lines[1:]:
        if line.startswith(("Explanation:", "Developer debug context:")):
            keep.append(line)
    return " ".join(keep)
