"""The original Ditty's `MetricsLogger`, and how any such object joins a run's logging.

`MetricsLogger(output_dir, use_tensorboard=True, use_wandb=False, ...)` writes TensorBoard scalars
under `output_dir/logs` (and to wandb when asked). Handed to `Pipeline(metrics_logger=...)`, it
(or any object with `log_scalar(tag, value, step)`) receives every record the run logs, on rank 0,
as "train/loss", "train/lr", "val/loss", ... (ditty.metrics.user_logger, the core's side); with `log_gradients=True` its
`log_gradients(model, step)` runs every `gradient_log_every` steps, after clipping and before the
optimizer step, as in the original. metrics.jsonl is written as always.

The TensorBoard writer is created at the first record, not in the constructor, so that building
the logger before the run does not leave files in a run directory that is not a run yet.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Optional

from ditty.config.errors import RecipeError


class MetricsLogger:
    """Scalars, histograms and text to TensorBoard (and wandb), with the original's methods."""

    def __init__(
        self,
        output_dir: str,
        use_tensorboard: bool = True,
        use_wandb: bool = False,
        wandb_project: str = "ditty-training",
        wandb_config: Optional[dict] = None,
        log_gradients: bool = False,
        gradient_log_every: int = 20,
        gradient_log_histograms: bool = True,
        gradient_components: Optional[list[str]] = None,
    ) -> None:
        for flag, package in ((use_tensorboard, "tensorboard"), (use_wandb, "wandb")):
            if flag and importlib.util.find_spec(package) is None:
                raise RecipeError.single(
                    f"MetricsLogger(use_{package}=True) needs the {package} package, which is not installed",
                    key="metrics_logger",
                    fix=f"pip install {package}, or use_{package}=False",
                )
        self.output_dir = output_dir
        self.use_tensorboard = use_tensorboard
        self.use_wandb = use_wandb
        self.wandb_project = wandb_project
        self.wandb_config = wandb_config
        self.log_gradients_enabled = log_gradients
        self.gradient_log_every = gradient_log_every
        self.gradient_log_histograms = gradient_log_histograms
        self.gradient_components = gradient_components or ["decoder", "denoiser"]
        self._tb_writer: Any = None
        self._wandb: Any = None

    # -- sinks, opened at first use

    def _writer(self) -> Any:
        if self.use_tensorboard and self._tb_writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb_writer = SummaryWriter(log_dir=os.path.join(self.output_dir, "logs"))
        return self._tb_writer

    def _run(self) -> Any:
        if self.use_wandb and self._wandb is None:
            import wandb

            if not wandb.run:
                wandb.init(project=self.wandb_project, config=self.wandb_config)
            self._wandb = wandb
        return self._wandb

    # -- the original's methods

    def log_scalar(self, tag: str, value: float, step: int) -> None:
        if self._writer() is not None:
            self._tb_writer.add_scalar(tag, value, step)
        if self._run() is not None:
            self._wandb.log({tag: value}, step=step)

    def log_scalars(self, main_tag: str, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.log_scalar(f"{main_tag}/{name}", value, step)

    def log_metrics(self, metrics: dict[str, float], step: int, prefix: str = "train") -> None:
        for name, value in metrics.items():
            self.log_scalar(f"{prefix}/{name}", value, step)

    def log_lr(self, optimizer: Any, step: int) -> None:
        for index, group in enumerate(optimizer.param_groups):
            self.log_scalar("train/lr" if index == 0 else f"train/lr_group_{index}", float(group.get("lr", 0)), step)

    def log_grad_norm(self, grad_norm: float, step: int) -> None:
        self.log_scalar("train/grad_norm", grad_norm, step)

    def log_histogram(self, tag: str, values: Any, step: int) -> None:
        values = _local(values)
        if self._writer() is not None:
            self._tb_writer.add_histogram(tag, values, step)
        if self._run() is not None:
            self._wandb.log({tag: self._wandb.Histogram(values.numpy())}, step=step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        if self._writer() is not None:
            self._tb_writer.add_text(tag, text, step)
        if self._run() is not None:
            self._wandb.log({tag: self._wandb.Html(f"<pre>{text}</pre>")}, step=step)

    def log_model_watch(self, model: Any) -> None:
        if self._run() is not None:
            self._wandb.watch(model, log="all", log_freq=self.gradient_log_every)

    def log_gradients(self, model: Any, step: int) -> None:
        """Histogram and statistics of the gradients of the named `gradient_components` of the model
        (attributes of it, looked up through torch.compile/DDP wrappers). Rank-local: no collective."""
        if not self.log_gradients_enabled:
            return
        inner = getattr(model, "module", model)
        inner = getattr(inner, "_orig_mod", inner)
        for component_name in self.gradient_components:
            component = getattr(inner, component_name, None)
            if component is None:
                continue
            for name, parameter in component.named_parameters():
                if parameter.grad is None:
                    continue
                grad = _local(parameter.grad)
                tag = f"grads/{component_name}/{name}"
                if self.gradient_log_histograms and grad.numel() and bool(grad.isfinite().all()):
                    self.log_histogram(tag, grad, step)
                stats = {"mean": grad.mean(), "std": grad.std(), "norm": grad.norm(), "max": grad.abs().max()}
                self.log_scalars(tag, {k: float(v) for k, v in stats.items()}, step)

    def flush(self) -> None:
        if self._tb_writer is not None:
            self._tb_writer.flush()

    def close(self) -> None:
        if self._tb_writer is not None:
            self._tb_writer.close()
            self._tb_writer = None
        if self._wandb is not None and self._wandb.run:
            self._wandb.finish()
        self._wandb = None


def _local(tensor: Any) -> Any:
    """A detached fp32 CPU copy; an FSDP2 DTensor gives its local shard (full_tensor would be a collective)."""
    if hasattr(tensor, "to_local"):
        tensor = tensor.to_local()
    return tensor.detach().cpu().float()
