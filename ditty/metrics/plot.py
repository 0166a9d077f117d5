"""curves.png: training loss, learning rate, the training reward and evaluation curves, redrawn from metrics.jsonl.

People would rather look than read JSON. `plot_run(run_dir)` works on any finished or running run,
so `ditty plot RUN_DIR` and the end of training share it.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

from ditty.metrics.logger import read_metrics

PLOT_FILE = "curves.png"


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(record["step"])
            ys.append(float(value))
    return xs, ys


def plot_run(run_dir: str, out_path: Optional[str] = None, *, records: Optional[list[dict]] = None) -> str:
    """Draw loss, lr and every val_* metric of RUN_DIR/metrics.jsonl (or of `records`, already read)
    into a PNG; return its path."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot's import
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir) if records is None else records
    out_path = out_path or os.path.join(run_dir, PLOT_FILE)
    fig = figure(records, os.path.basename(os.path.abspath(run_dir)))
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def figure(records: list[dict], name: str) -> Any:
    """The matplotlib figure of `records` (see the module doc), one panel per kind of curve."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot's import
    import matplotlib.pyplot as plt

    eval_keys = sorted({k for r in records for k in r if k.startswith("val_") and k != "val_loss"})
    # Fractions (exact match, accuracy, F1) and unbounded metrics (perplexity) on separate axes: on one
    # axis a perplexity of 60 flattens an exact match of 0.95 into the floor.
    fractions = [k for k in eval_keys if all(0.0 <= y <= 1.0 for y in _series(records, k)[1])]
    others = [k for k in eval_keys if k not in fractions]
    rewards = training_reward_keys(records)
    panels = 2 + (1 if rewards else 0) + (1 if fractions else 0) + (1 if others else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6), squeeze=False)
    axes = axes[0]

    ax = axes[0]
    ax.plot(*_series(records, "loss"), label="train loss", lw=1.2)
    vx, vy = _series(records, "val_loss")
    if vx:
        ax.plot(vx, vy, "o-", label="val loss", lw=1.2, ms=4)
    skipped = [r["step"] for r in records if r.get("skipped")]
    for step in skipped:
        ax.axvline(step, color="red", alpha=0.3, lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("loss" + (f" ({len(skipped)} skipped steps in red)" if skipped else ""))
    ys = _series(records, "loss")[1] + vy
    # A log scale only for a positive loss that spans decades: a policy loss that crosses zero (GRPO's,
    # around +-1e-10) would lose its negative half and look like noise on one.
    if ys and min(ys) > 0 and max(ys) / min(ys) > 20:
        ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3)

    ax = axes[1]
    ax.plot(*_series(records, "lr"), ".-", color="tab:green", lw=1.2, ms=3)  # the rate at each logged step
    ax.set_xlabel("step")
    ax.set_title("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.grid(alpha=0.3)

    rest = list(axes[2:])
    if rewards:
        ax = rest.pop(0)
        for key in rewards:
            ax.plot(*_series(records, key), ".-", label=key, lw=1.0, ms=3)
        ax.set_xlabel("step")
        ax.set_title("training reward")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)

    for ax, keys, title in zip(rest, [k for k in (fractions, others) if k], ["evaluation", "evaluation"]):
        for key in keys:
            ax.plot(*_series(records, key), "o-", label=key, lw=1.2, ms=4)
        if keys is fractions:
            ax.set_ylim(-0.02, 1.02)  # fractions on their full scale
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.legend()
        ax.grid(alpha=0.3)

    fig.suptitle(name)
    fig.tight_layout()
    return fig


def training_reward_keys(records: list[dict]) -> list[str]:
    """What a run's policy earned while training: RL's reward and each function's mean, online pairs'
    sampled reward, a preference loss's pair accuracy (linear axes: rewards may be negative)."""
    keys = {k for r in records for k in r}
    wanted = ["reward", "online/reward", "rewards/accuracies"]
    wanted += sorted(k for k in keys if k.startswith("rewards/") and k.endswith("/mean"))
    return [k for k in wanted if k in keys]
