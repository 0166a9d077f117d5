"""Generic (non language-model) data: any dataset of samples plus a collate function, or a DataLoader.

Map-style samples go through the one global order of `BatchStream`, collated by `SampleCollator`:
`global_batch_size` samples per optimizer step is the invariant; each epoch has one seeded
permutation of the whole dataset (from seed and epoch, never from the world size); `cursor` counts
samples consumed, and rank r takes the r-th contiguous slice of each global batch, cut into
micro-batches of `micro_batch_size`. So two ranks with micro 4 see exactly the samples one rank
with micro 8 sees, and a resumed stream continues on any world size. Samples are collated by the
user's `collate_fn` (default: torch's `default_collate`).

A user's own DataLoader cannot be reordered without breaking what the user asked for, so
`LoaderStream` only groups its batches: each of its batches is one micro-batch, `accumulation`
of them make a step, epochs restart the loader. Its order is the loader's (world-size dependent
unless the loader's sampler says otherwise).

In metrics, `tokens` counts samples for generic data (there are no tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional, Protocol, Sequence

import torch

from ditty.config.errors import RecipeError
from ditty.data.formats.base import Collator


class GenericTask(Protocol):
    """An evaluation hook for generic data (the LM path has `ditty.data.task.Task`).

    `evaluate` returns scalar metrics (logged as val_<name>); it may write files into `run_dir`
    (e.g. a grid of diffusion samples). Every rank calls it (a sharded model needs them all);
    `run_dir` is "" except on rank 0, so only one process writes. `pipeline` is the trainer's
    pipeline, so a task can use a stage's own tools (a diffusion preprocessor's `sample`) without
    importing it.
    """

    name: str

    def evaluate(
        self, model: torch.nn.Module, *, device: torch.device, pipeline: Any, run_dir: str, step: int
    ) -> dict[str, float]: ...


def batch_samples(batch: Any) -> int:
    """Samples in a collated batch: the leading size of its first tensor (dict, tuple or tensor)."""
    if torch.is_tensor(batch):
        return int(batch.shape[0]) if batch.dim() else 1
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    for value in values:
        if torch.is_tensor(value) and value.dim():
            return int(value.shape[0])
        if isinstance(value, (tuple, list, Mapping)) and value:
            return batch_samples(value)
    if isinstance(batch, (tuple, list)):
        return len(batch)
    raise TypeError(f"cannot tell how many samples a {type(batch).__name__} batch holds")


def to_device(batch: Any, device: torch.device) -> Any:
    """Tensors of a (nested) batch moved to `device`; other values kept."""
    if torch.is_tensor(batch):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


class SampleCollator(Collator):
    """A Python API `collate_fn` (default: torch's `default_collate`) as the collator of the one
    stream; a batch counts its samples (the loss's denominator and the `tokens` metric)."""

    tokenized = False

    def __init__(self, collate_fn: Optional[Callable[[list], Any]] = None) -> None:
        self.given = collate_fn is not None
        self.collate_fn = collate_fn or torch.utils.data.default_collate

    def __call__(self, samples: Sequence[Any], positions: Any = None) -> Any:
        if self.given:
            return self.collate_fn(list(samples))
        # torch's default_collate turns a field of number lists ([ids...] per sample) into one tensor
        # per position; token ids given as lists are meant as one row per sample.
        samples = [_number_lists_as_tensors(sample) for sample in samples]
        try:
            return self.collate_fn(samples)
        except RuntimeError as error:
            if "equal size" not in str(error) and "same size" not in str(error):
                raise
            lengths = {
                key: sorted({len(sample[key]) for sample in samples})
                for key in (samples[0] if isinstance(samples[0], Mapping) else {})
                if torch.is_tensor(samples[0][key]) and samples[0][key].dim()
            }
            ragged = {key: sizes for key, sizes in lengths.items() if len(sizes) > 1}
            raise RecipeError.single(
                "the samples of a batch have different lengths and cannot be stacked"
                + (
                    ": " + ", ".join(f"{key} {sizes[0]} to {sizes[-1]}" for key, sizes in ragged.items())
                    if ragged
                    else ""
                ),
                key="dataset",
                fix="give samples of one length (pad them), or pass collate_fn= to pad each batch",
            ) from error

    def supervised_count(self, batch: Any) -> torch.Tensor:
        return torch.tensor(batch_samples(batch))

    def input_count(self, batch: Any) -> torch.Tensor:
        return torch.tensor(batch_samples(batch))


def _number_lists_as_tensors(sample: Any) -> Any:
    """A sample (a mapping) with every non-empty list of ints or floats as a tensor; else as it is."""
    if not isinstance(sample, Mapping):
        return sample
    return {
        key: torch.tensor(value)
        if isinstance(value, list)
        and value
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        else value
        for key, value in sample.items()
    }


def check_not_empty(dataset: Any) -> None:
    """A Python API dataset without samples is the user's error (a DataLoader or an iterable dataset
    is caught when it yields nothing)."""
    if not isinstance(dataset, torch.utils.data.DataLoader) and hasattr(dataset, "__len__") and len(dataset) == 0:
        raise RecipeError.single("the training dataset is empty", key="data", fix="give a dataset with samples")


class LoaderStream:
    """Steps from a user's DataLoader: `accumulation_steps` of its batches per step, epochs restart it."""

    def __init__(self, loader: Any, *, accumulation_steps: int) -> None:
        self.loader = loader
        self.accumulation_steps = accumulation_steps
        self.cursor = 0
        self.epoch = 0
        self._batches_this_epoch = 0
        self._iterator = iter(loader)

    def next_step(self) -> list[Any]:
        batches = []
        while len(batches) < self.accumulation_steps:
            try:
                batch = next(self._iterator)
            except StopIteration:
                if self._batches_this_epoch == 0:  # an empty loader would loop here for ever
                    raise RecipeError.single(
                        "the DataLoader passed as the dataset yielded no batches", key="data", fix="give it samples"
                    ) from None
                self.epoch, self._batches_this_epoch = self.epoch + 1, 0
                self._iterator = iter(self.loader)
                continue
            batches.append(batch)
            self._batches_this_epoch += 1
            self.cursor += batch_samples(batch)
        return batches

    def state_dict(self) -> dict[str, int]:
        return {"cursor": self.cursor, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Skips batches up to the saved cursor (the loader's own order must be reproducible)."""
        while self.cursor < int(state["cursor"]):
            self.next_step()

    def source_tokens(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        """The user's DataLoader stops its own workers."""


def loader_samples(loader: Any) -> int:
    """Samples per epoch of a DataLoader (its dataset's length, else batches x batch size)."""
    dataset = getattr(loader, "dataset", None)
    try:
        return len(dataset)
    except TypeError:
        return len(loader) * (loader.batch_size or 1)


def eval_micro_batches(dataset: Any, micro_batch_size: int, collate_fn: Optional[Callable] = None) -> list[Any]:
    """The whole validation set in order, collated into micro-batches (a DataLoader is used as is)."""
    if isinstance(dataset, torch.utils.data.DataLoader):
        return list(dataset)
    collate = collate_fn or torch.utils.data.default_collate
    return [
        collate([dataset[i] for i in range(s, min(s + micro_batch_size, len(dataset)))])
        for s in range(0, len(dataset), micro_batch_size)
    ]
