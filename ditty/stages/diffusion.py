"""DDPM diffusion: a noise schedule, the training-time noising stage, reverse sampling, a sample grid.

Training (Ho et al. 2020, "epsilon prediction"): draw t uniformly and noise ~ N(0, I), give the
model x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) noise and t, and regress its output on
the noise (MSE). `NoisePreProcessor` is that first half as a pipeline stage; `ditty.loss.MSELoss`
(target_key "target") is the second.

Sampling: start from pure noise and apply `Scheduler.step` from t = T-1 down to 0.

`NoisePreProcessor` subclasses `ditty.stages.processors.PreProcessor`, so the recipe compiler's
slot check accepts it like any user processor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence, Union

import torch

from ditty.stages.processors import PreProcessor

SCHEDULE_TYPES = ("cosine", "linear")
COSINE_OFFSET = 0.008
"""s in Nichol & Dhariwal (2021), eq. 17: keeps beta_0 from being vanishingly small."""
MAX_BETA = 0.999
"""Cap on cosine betas; near t = T the cosine schedule's beta tends to 1 (same paper)."""


class Scheduler:
    """The DDPM noise schedule over `max_timesteps` steps and its forward and reverse steps.

    "linear" spaces betas evenly from `beta_start` to `beta_end` (Ho et al.); "cosine" derives them
    from a squared-cosine alpha_bar (Nichol & Dhariwal) and ignores beta_start/beta_end.
    `clip_sample` clamps the model's implied x0 to [-1, 1] at each reverse step, which assumes
    data scaled to that range and keeps early, poor noise predictions from running away.
    Tables are computed in float64 and stored in float32 on the CPU; they follow the inputs' device.
    """

    def __init__(
        self,
        max_timesteps: Optional[int] = None,
        schedule_type: str = "cosine",
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
        *,
        clip_sample: bool = True,
        timesteps: Optional[int] = None,
    ) -> None:
        if timesteps is not None and max_timesteps is not None and timesteps != max_timesteps:
            raise ValueError(
                f"max_timesteps={max_timesteps} and timesteps={timesteps} disagree: timesteps is the original "
                "Ditty's name of max_timesteps, so pass one of them"
            )
        max_timesteps = next((n for n in (timesteps, max_timesteps) if n is not None), 1000)  # the original's keyword
        _validate(max_timesteps, schedule_type, beta_start, beta_end)
        self.max_timesteps = max_timesteps
        self.clip_sample = clip_sample
        self.create_noise_schedule(schedule_type, beta_start=beta_start, beta_end=beta_end)

    @property
    def timesteps(self) -> int:
        return self.max_timesteps

    @property
    def alphas_cumprod(self) -> torch.Tensor:
        """alpha_bar under the original Ditty's (and diffusers') name."""
        return self.alpha_bar

    def create_noise_schedule(
        self, schedule_type: str = "cosine", F: float = 1.0, beta_start: float = 1e-4, beta_end: float = 0.02
    ) -> None:
        """(Re)build the tables for a schedule, as the original's method of this name did: "linear"
        from beta_start to beta_end, or "cosine" with its betas scaled by F**2 (F = 1 keeps them;
        scaled betas are clipped to [1e-4, MAX_BETA])."""
        _validate(self.max_timesteps, schedule_type, beta_start, beta_end)
        self.schedule_type, self.beta_start, self.beta_end = schedule_type, beta_start, beta_end
        betas = (
            _cosine_betas(self.max_timesteps)
            if schedule_type == "cosine"
            else torch.linspace(beta_start, beta_end, self.max_timesteps, dtype=torch.float64)
        )
        if F != 1.0 and schedule_type == "cosine":  # F rescales the cosine schedule only, as in the original
            betas = (betas * F**2).clamp(1e-4, MAX_BETA)
        alphas = 1.0 - betas
        alpha_bar = torch.cumprod(alphas, dim=0)
        alpha_bar_prev = torch.cat([torch.ones(1, dtype=torch.float64), alpha_bar[:-1]])
        self.betas = betas.float()
        self.alphas = alphas.float()
        self.alpha_bar = alpha_bar.float()
        # Posterior q(x_{t-1} | x_t, x0) = N(coef_x0 * x0 + coef_xt * x_t, posterior_variance).
        self.posterior_variance = (betas * (1 - alpha_bar_prev) / (1 - alpha_bar)).float()
        self.posterior_coef_x0 = (betas * alpha_bar_prev.sqrt() / (1 - alpha_bar)).float()
        self.posterior_coef_xt = ((1 - alpha_bar_prev) * alphas.sqrt() / (1 - alpha_bar)).float()

    def __repr__(self) -> str:
        return (
            f"Scheduler(max_timesteps={self.max_timesteps}, schedule_type={self.schedule_type!r}, "
            f"beta_start={self.beta_start}, beta_end={self.beta_end}, clip_sample={self.clip_sample})"
        )

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: Union[torch.Tensor, int]) -> torch.Tensor:
        """x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) noise; t is an int or one per sample."""
        alpha_bar = _per_sample(self.alpha_bar, t, x0)
        return alpha_bar.sqrt() * x0 + (1 - alpha_bar).sqrt() * noise

    def predict_x0(self, model_output: torch.Tensor, t: Union[torch.Tensor, int], x_t: torch.Tensor) -> torch.Tensor:
        """The clean image implied by a noise prediction (add_noise solved for x0)."""
        alpha_bar = _per_sample(self.alpha_bar, t, x_t)
        x0 = (x_t - (1 - alpha_bar).sqrt() * model_output) / alpha_bar.sqrt()
        return x0.clamp(-1, 1) if self.clip_sample else x0

    def step(
        self,
        model_output: torch.Tensor,
        t: Union[torch.Tensor, int],
        x_t: torch.Tensor,
        generator: Optional[torch.Generator] = None,
    ) -> torch.Tensor:
        """One reverse step x_t -> x_{t-1}, from the model's noise prediction at t.

        Samples the DDPM posterior with its own variance (beta-tilde, "fixed small"); at t = 0 the
        mean is returned without noise.
        """
        x0 = self.predict_x0(model_output, t, x_t)
        mean = _per_sample(self.posterior_coef_x0, t, x_t) * x0 + _per_sample(self.posterior_coef_xt, t, x_t) * x_t
        noise = torch.randn(x_t.shape, generator=generator, dtype=x_t.dtype, device="cpu").to(x_t.device)
        std = _per_sample(self.posterior_variance, t, x_t).sqrt()
        not_last = (_timesteps(t, x_t) > 0).to(x_t.device, x_t.dtype).reshape(-1, *([1] * (x_t.dim() - 1)))
        return mean + not_last * std * noise

    @torch.no_grad()
    def sample(
        self,
        model: Callable[..., torch.Tensor],
        shape: tuple[int, ...],
        generator: Optional[torch.Generator] = None,
        device: Union[str, torch.device] = "cpu",
    ) -> torch.Tensor:
        """Run the whole reverse chain from N(0, I): `max_timesteps` calls of `model(x_t, t)`.

        The model is put in eval mode for the loop and restored after. Noise is drawn on the CPU
        from `generator`, so a seed gives the same samples on any device.
        """
        was_training = getattr(model, "training", None)
        if was_training:
            model.eval()
        try:
            x = torch.randn(shape, generator=generator).to(device)
            for step in reversed(range(self.max_timesteps)):
                t = torch.full((shape[0],), step, dtype=torch.long, device=device)
                x = self.step(model(x, t), t, x, generator)
            return x
        finally:
            if was_training:
                model.train()

    def draw_timesteps(
        self, batch_size: int, generator: Optional[torch.Generator] = None, device: Union[str, torch.device] = "cpu"
    ) -> torch.Tensor:
        """Timesteps for training, uniform over [0, max_timesteps)."""
        return torch.randint(0, self.max_timesteps, (batch_size,), generator=generator).to(device)


def _validate(max_timesteps: Any, schedule_type: Any, beta_start: Any, beta_end: Any) -> None:
    if schedule_type not in SCHEDULE_TYPES:
        raise ValueError(f"schedule_type {schedule_type!r} is not one of {', '.join(map(repr, SCHEDULE_TYPES))}")
    if isinstance(max_timesteps, bool) or not isinstance(max_timesteps, int) or max_timesteps < 1:
        raise ValueError(f"max_timesteps must be a positive integer, not {max_timesteps!r}")
    if not 0 < beta_start < beta_end < 1:
        raise ValueError(f"need 0 < beta_start < beta_end < 1, got beta_start={beta_start}, beta_end={beta_end}")


def _cosine_betas(max_timesteps: int) -> torch.Tensor:
    steps = torch.arange(max_timesteps + 1, dtype=torch.float64) / max_timesteps
    alpha_bar = torch.cos((steps + COSINE_OFFSET) / (1 + COSINE_OFFSET) * math.pi / 2) ** 2
    return (1 - alpha_bar[1:] / alpha_bar[:-1]).clamp(max=MAX_BETA)


def _timesteps(t: Union[torch.Tensor, int], like: torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(t, dtype=torch.long)
    return t.expand(like.shape[0]) if t.dim() == 0 else t


def _per_sample(table: torch.Tensor, t: Union[torch.Tensor, int], like: torch.Tensor) -> torch.Tensor:
    """table[t], shaped to broadcast over `like` ([B] -> [B, 1, 1, ...]), in its dtype and device.

    Cost: on an accelerator, t comes to the CPU and B values go back (a sync per call); negligible
    beside a denoiser's forward at these sizes.
    """
    values = table[_timesteps(t, like).cpu()]
    return values.to(like.device, like.dtype).reshape(-1, *([1] * (like.dim() - 1)))


class NoisePreProcessor(PreProcessor):
    """Training stage: replaces the clean batch by x_t and records what the loss and model need.

    After `process`, the batch is the noisy images x_t (the model's input), ctx["target"] is the
    noise (for MSELoss), and ctx["forward_kwargs"]["t"] (also ctx["t"]) the timesteps, so the
    trainer calls model(x_t, t=t). The batch may be a tensor of images, a tuple/list whose first
    item is the images (a TensorDataset's (x,) or (x, y)), or a dict holding them under `image_key`.
    `rank` is the images' number of dimensions, batch included, for the contract; noise and
    timesteps are drawn on the CPU (from `seed` if given) and moved to the images' device.
    """

    def __init__(
        self,
        max_timesteps: Optional[int] = None,
        schedule_type: str = "cosine",
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
        *,
        image_key: str = "pixel_values",
        rank: int = 4,
        seed: Optional[int] = None,
        scheduler: Optional[Scheduler] = None,
        image_shape: Optional[Sequence[int]] = None,
    ) -> None:
        self.scheduler = scheduler or Scheduler(max_timesteps, schedule_type, beta_start, beta_end)
        self.image_key = image_key
        # Shape of one image (without the batch), for `sample`; else the shape of the last batch seen.
        self.image_shape = tuple(image_shape) if image_shape is not None else None
        super().__init__(
            contract=f"{image_key}:{rank}:f32 -> x_t:{rank}:f32 | ctx.target:{rank}:f32, "
            "ctx.t:1:i64, ctx.forward_kwargs.t:1:i64"
        )
        # None draws from torch's global RNG (which the trainer seeds per rank); a seed here is the
        # same on every rank, so data-parallel ranks would share one noise sequence.
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)

    def process(self, batch: Any, ctx: dict) -> tuple[torch.Tensor, dict]:
        x0 = self._images(batch)
        if self.image_shape is None:
            self.image_shape = tuple(x0.shape[1:])
        t = self.scheduler.draw_timesteps(x0.shape[0], self.generator, x0.device)
        noise = torch.randn(x0.shape, generator=self.generator, dtype=x0.dtype, device="cpu").to(x0.device)
        ctx["target"] = noise
        ctx["t"] = t
        ctx.setdefault("forward_kwargs", {})["t"] = t
        return self.scheduler.add_noise(x0, noise, t), ctx

    def sample(
        self,
        model: Callable[..., torch.Tensor],
        count: int,
        *,
        generator: Optional[torch.Generator] = None,
        device: Union[str, torch.device] = "cpu",
    ) -> torch.Tensor:
        """`count` images drawn by the reverse chain with this stage's schedule (the sampler that
        evaluation hooks such as ditty.data.formats.images.DigitsTask look for in the pipeline)."""
        if self.image_shape is None:
            raise ValueError("NoisePreProcessor.sample: the image shape is unknown; pass image_shape=(C, H, W)")
        return self.scheduler.sample(model, (count, *self.image_shape), generator, device)

    save_grid = staticmethod(lambda samples, path: save_sample_grid(samples, path))
    """Write samples as a PNG grid (see `save_sample_grid`)."""

    def _images(self, batch: Any) -> torch.Tensor:
        if torch.is_tensor(batch):
            return batch
        if isinstance(batch, Mapping):
            if self.image_key not in batch:
                raise KeyError(
                    f"NoisePreProcessor: the batch has no {self.image_key!r} (keys: {sorted(batch)}); set image_key"
                )
            return batch[self.image_key]
        if isinstance(batch, (tuple, list)) and batch and torch.is_tensor(batch[0]):
            return batch[0]
        raise TypeError(f"NoisePreProcessor: cannot find images in a {type(batch).__name__} batch")


def save_sample_grid(samples: torch.Tensor, path: str, *, columns: Optional[int] = None, scale: int = 8) -> str:
    """Write samples in [-1, 1] as one grayscale PNG grid (matplotlib's Agg canvas, no display).

    Accepts [N, H, W], [N, 1, H, W], or flat square [N, H*W]. Each pixel becomes `scale` x `scale`
    so 8x8 digits stay legible. Returns the path.
    """
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    images = _as_images(samples.detach().float().cpu()).numpy()
    count, height, width = images.shape
    columns = columns or math.ceil(math.sqrt(count))
    rows = math.ceil(count / columns)
    grid = np.full((rows * (height + 1) + 1, columns * (width + 1) + 1), -1.0)  # 1-pixel black borders
    for index, image in enumerate(images):
        top, left = (1 + k * (size + 1) for k, size in zip(divmod(index, columns), (height, width)))
        grid[top : top + height, left : left + width] = image
    figure = Figure(figsize=(grid.shape[1] * scale / 100, grid.shape[0] * scale / 100), dpi=100)
    axes = figure.add_axes((0, 0, 1, 1))
    axes.imshow(grid.clip(-1, 1), cmap="gray", vmin=-1, vmax=1, interpolation="nearest")
    axes.axis("off")
    FigureCanvasAgg(figure).print_png(str(path))
    return str(path)


def _as_images(samples: torch.Tensor) -> torch.Tensor:
    if samples.dim() == 4 and samples.shape[1] == 1:
        return samples[:, 0]
    if samples.dim() == 3:
        return samples
    if samples.dim() == 2 and math.isqrt(samples.shape[1]) ** 2 == samples.shape[1]:
        side = math.isqrt(samples.shape[1])
        return samples.reshape(-1, side, side)
    raise ValueError(
        f"save_sample_grid: expected [N, H, W], [N, 1, H, W] or [N, H*W] samples, got {tuple(samples.shape)}"
    )
