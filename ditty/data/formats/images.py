"""The `images` format: scikit-learn's bundled 8x8 handwritten digits (1797 images, no download).

`data.source = "builtin"`, `data.name = "digits"` reads them (the name implies this format: see
`ditty.data.formats.format_of`). Samples are float32 images [1, 8, 8] scaled from 0..16 to [-1, 1]
(the range DDPM sampling clips to); a micro-batch is their stack, and every sample takes loss. The
validation split is a seeded `data.val_fraction` of the images. `DigitsTask` is the evaluation hook:
it draws samples with the pipeline's sampler (a stage with a `sample(model, count, generator=,
device=)` method, e.g. `ditty.diffusion.NoisePreProcessor`), writes them as `samples.png` into the
run directory, and scores them against the real digits: mean nearest-neighbour distance (lower is
more digit-like; the real held-out digits score about 2.5, pure noise about 8) and how many of the
ten classes a classifier fitted on the real digits finds among them (each class counts from 2% of
samples).

scikit-learn is the optional extra `diffusion` (`pip install ditty[diffusion]`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import torch

from ditty.config.errors import RecipeError
from ditty.data.formats.base import Collator, DataFormat
from ditty.data.rows import RowCheck

if TYPE_CHECKING:
    from ditty.config.sections import DataConfig

SAMPLES_FILE = "samples.png"
CLASS_SHARE = 0.02
"""A class counts as covered when at least this share of the samples is classified as it."""
BUILTINS = ("digits",)
"""The built-in datasets of images (`data.name`)."""


class ImagesFormat(DataFormat):
    """Image tensors of a built-in dataset: nothing to tokenize, stacked into a micro-batch."""

    name = "images"
    builtin_only = True
    tokenized = False

    def columns(self, data: "DataConfig") -> dict[str, str]:
        return {"data.name": "image"}

    def row_check(self, data: "DataConfig") -> RowCheck:
        return RowCheck({"image": "any"})

    def read_builtin(self, data: "DataConfig", seed: int) -> Any:
        return build_digits(data.val_fraction, seed)

    def collator(self, tokenizer: Any, data: "DataConfig", **facts: Any) -> Collator:
        return ImageCollator()


class ImageCollator(Collator):
    """Images -> one [B, ...] tensor; every sample takes loss and counts as one input."""

    tokenized = False

    def __call__(self, samples: Sequence[Any], positions: Optional[Sequence[int]] = None) -> torch.Tensor:
        return torch.stack(list(samples))

    def supervised_count(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.tensor(len(batch))

    def input_count(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.tensor(len(batch))

    def blank(self, batch: torch.Tensor) -> torch.Tensor:
        return batch[:0]


def load_digit_images() -> tuple[torch.Tensor, np.ndarray]:
    """All 1797 images as [N, 1, 8, 8] float32 in [-1, 1], and their labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise RecipeError.single(
            'data.name = "digits" needs scikit-learn, which is not installed',
            key="data.name",
            fix='pip install "ditty[diffusion]" (or pip install scikit-learn)',
        ) from None
    digits = load_digits()
    images = torch.from_numpy(digits.data / 16 * 2 - 1).float().reshape(-1, 1, 8, 8)
    return images, digits.target


def build_digits(val_fraction: float, seed: int) -> Any:
    """The digits as a source's rows (ditty.data.build.SourceRows): training and held-out images,
    and the sampling hook scored against the training images."""
    from ditty.data.build import SourceRows

    images, labels = load_digit_images()
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    held = int(round(len(images) * val_fraction))
    train_idx, val_idx = order[held:], order[:held]
    val = ImageDataset(images[val_idx]) if held else None
    hook = DigitsTask(reference=images[train_idx], labels=labels[train_idx.numpy()])
    return SourceRows(ImageDataset(images[train_idx]), val, 0, hook=hook)


class ImageDataset(torch.utils.data.Dataset):
    """A tensor of images as a dataset of single images (default_collate stacks them)."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.images[index]


@dataclass
class DigitsTask:
    """Sample, save the grid, and score the samples against real digits (see the module doc)."""

    reference: torch.Tensor
    labels: np.ndarray
    num_samples: int = 100
    seed: int = 1
    name: str = "digits"
    _scorer: Optional[Any] = field(default=None, repr=False)

    def evaluate(
        self, model: torch.nn.Module, *, device: torch.device, pipeline: Any, run_dir: str, step: int
    ) -> dict[str, float]:
        sampler = next((s for s in getattr(pipeline, "preprocessors", []) if hasattr(s, "sample")), None)
        if sampler is None:
            return {}  # no generative stage in this pipeline: nothing to draw
        generator = torch.Generator().manual_seed(self.seed)
        samples = sampler.sample(model, self.num_samples, generator=generator, device=device).float().cpu()
        if run_dir and hasattr(sampler, "save_grid"):
            sampler.save_grid(samples, os.path.join(run_dir, SAMPLES_FILE))
        return self.score(samples)

    def score(self, samples: torch.Tensor) -> dict[str, float]:
        """nn_distance (mean L2 to the closest real digit) and classes (of 10, each >= 2% of samples)."""
        flat = samples.reshape(len(samples), -1).clamp(-1, 1)
        reference = self.reference.reshape(len(self.reference), -1)
        nn_distance = torch.cdist(flat, reference).min(dim=1).values.mean().item()
        predicted = self._classifier().predict(flat.numpy())
        counts = np.bincount(predicted, minlength=10)
        return {"nn_distance": nn_distance, "classes": float((counts >= CLASS_SHARE * len(flat)).sum())}

    def _classifier(self) -> Any:
        if self._scorer is None:
            from sklearn.linear_model import LogisticRegression

            flat = self.reference.reshape(len(self.reference), -1).numpy()
            self._scorer = LogisticRegression(max_iter=2000).fit(flat, self.labels)
        return self._scorer
