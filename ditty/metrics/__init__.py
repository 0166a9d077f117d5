"""Run metrics: the progress bar, metrics.jsonl, TensorBoard, wandb, and the curves PNG.

Layer 2: imports only `ditty._utils` and `ditty.config`. Every sink writes on rank 0 only; other ranks
get a `MetricsLogger` whose sinks are empty, so callers never branch on the rank.
"""

from ditty.metrics.logger import JsonlSink, MetricsLogger, TensorBoardSink, WandbSink, build_logger
from ditty.metrics.plot import plot_run
from ditty.metrics.progress import Progress

__all__ = [
    "JsonlSink",
    "MetricsLogger",
    "Progress",
    "TensorBoardSink",
    "WandbSink",
    "build_logger",
    "plot_run",
]
