"""The progress bar: loss, learning rate, tokens/s and ETA (tqdm computes the ETA from its rate)."""

from __future__ import annotations

import sys
from typing import Any, Optional

from ditty._utils.dist import is_main_process


class Progress:
    """A tqdm bar over optimizer steps on rank 0; a no-op when disabled or on other ranks.

    Postfix updates happen only at log steps (they are already synced there), so the bar adds no
    device synchronisation of its own.
    """

    def __init__(self, total: int, *, enabled: bool = True, initial: int = 0, desc: str = "train"):
        self.bar = None
        if enabled and is_main_process():
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total,
                initial=initial,
                desc=desc,
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr,
                # Redrawn often on a terminal; to a log file a line every 30 s is plenty.
                mininterval=0.5 if sys.stderr.isatty() else 30.0,
                # ETA and rate come from tqdm; loss, lr and tokens/s are set from logged records.
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
            )

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def set_metrics(self, record: dict[str, Any]) -> None:
        if self.bar is None:
            return
        shown: dict[str, str] = {}
        if "loss" in record:
            shown["loss"] = f"{float(record['loss']):.4f}"
        if "lr" in record:
            shown["lr"] = f"{float(record['lr']):.2e}"
        if "tokens_per_s" in record:
            shown["tok/s"] = f"{float(record['tokens_per_s']):,.0f}"
        if record.get("mfu") is not None:
            shown["mfu"] = f"{100 * float(record['mfu']):.1f}%"
        if "reward" in record:  # [rl]: the rollouts' mean reward and the share of the step spent generating
            shown["reward"] = f"{float(record['reward']):.3f}"
        if "rollout/generation_share" in record:
            shown["gen"] = f"{100 * float(record['rollout/generation_share']):.0f}%"
        if "peak_mem_mb" in record:  # max over ranks
            shown["mem"] = f"{float(record['peak_mem_mb']):,.0f}MB"
        for key, value in record.items():
            if key.startswith("val_") and isinstance(value, (int, float)):
                shown[key] = f"{value:.4f}"
        self.bar.set_postfix(shown, refresh=True)

    def write(self, message: str) -> None:
        """Print a line without breaking the bar."""
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        elif is_main_process():
            print(message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def format_record(record: dict[str, Any], keys: Optional[list[str]] = None) -> str:
    """One readable line of a metrics record, for logs when the bar is off."""
    parts = []
    for key, value in record.items():
        if keys is not None and key not in keys:
            continue
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)
