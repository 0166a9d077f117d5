"""A user's own logger joins a run: every record it logs, and the gradients when the logger asks.

`RuntimeComponents(metrics_logger=...)` (the Python API's `metrics_logger=`) is any object with
`log_scalar(tag, value, step)`: the original Ditty's `MetricsLogger` (ditty.compat.metrics_logger)
or a user's own. It receives the run's records on rank 0 as TensorBoard-style tags ("train/loss",
"val/loss", ...); metrics.jsonl is written as always.
"""

from __future__ import annotations

from typing import Any

from ditty._utils.dist import is_main_process
from ditty.config.errors import RecipeError
from ditty.metrics.logger import _tb_tag


class UserLoggerSink:
    """A run's records, sent to a user's logger as scalars (TensorBoard-style tags)."""

    def __init__(self, user: Any) -> None:
        self.user = user

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for key, value in record.items():
            value = value.item() if hasattr(value, "item") else value
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.user.log_scalar(_tb_tag(key), value, step)

    def close(self) -> None:
        flush = getattr(self.user, "flush", None)
        if callable(flush):
            flush()  # the user's logger is theirs to close


def attach_user_logger(logger: Any, user: Any, trainer: Any) -> None:
    """Send every record of `logger` (ditty.metrics.MetricsLogger) to `user` too, on rank 0, and
    call `user.log_gradients(model, step)` every `user.gradient_log_every` steps when it logs
    gradients. A `user` without `log_scalar` is a RecipeError."""
    if not callable(getattr(user, "log_scalar", None)):
        raise RecipeError.single(
            f"metrics_logger is a {type(user).__name__}, which has no log_scalar(tag, value, step)",
            key="metrics_logger",
            fix="pass ditty.MetricsLogger(output_dir) or an object with log_scalar(tag, value, step)",
        )
    if not is_main_process():
        return
    logger.sinks.append(UserLoggerSink(user))
    every = int(getattr(user, "gradient_log_every", 0) or 0)
    wants = getattr(user, "log_gradients_enabled", False) and callable(getattr(user, "log_gradients", None))
    optimizer = getattr(trainer, "optimizer", None)
    if wants and every > 0 and hasattr(optimizer, "register_step_pre_hook"):

        def log_gradients(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
            step = trainer.state.step + 1  # the step this update completes; after clipping
            if step % every == 0:
                user.log_gradients(trainer.model, step)

        optimizer.register_step_pre_hook(log_gradients)
