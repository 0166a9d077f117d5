"""`Data`: a Hugging Face dataset turned into a DataLoader for the Python API (ditty.pipeline).

    data = Data(load_kwargs={"path": "json", "data_files": "train.jsonl", "split": "train"},
                tokenizer=tokenizer, batch_size=8, grad_accum=4, seed=0)
    loader = data.prepare([("filter", keep, {}), ("map", tokenize, {"batched": True})])

`prepare` applies each (method, function, kwargs) of `datasets.Dataset` in order, drops the
columns the collator does not use (when a tokenizer pads, everything but the model's inputs and
labels), and returns a DataLoader with seeded random sampling or, with `group_by_length`, sampling
that batches samples of similar length (less padding). `dataset=` takes an already loaded dataset
instead of `load_kwargs`; `load_args` are positional arguments of `datasets.load_dataset`.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from ditty._utils.labels import IGNORE_INDEX
from ditty.config.errors import Problem, RecipeError

TOKEN_COLUMNS = ("input_ids", "attention_mask", "labels", "position_ids", "token_type_ids")


class Data:
    def __init__(
        self,
        load_kwargs: Optional[dict] = None,
        tokenizer: Any = None,
        batch_size: int = 8,
        grad_accum: int = 1,
        seed: int = 0,
        *,
        load_args: Sequence = (),
        dataset: Any = None,
        collate_fn: Optional[Callable] = None,
        group_by_length: bool = False,
        keep_columns: Optional[Sequence[str]] = None,
        drop_last: bool = False,
        num_workers: int = 0,
    ) -> None:
        if dataset is None and load_kwargs is None and not load_args:
            raise RecipeError.single(
                "Data needs load_kwargs (for datasets.load_dataset), load_args or dataset=",
                key="Data",
                fix='Data(load_kwargs={"path": "json", "data_files": "train.jsonl", "split": "train"})',
            )
        problems = _setting_problems(load_kwargs, batch_size, grad_accum, num_workers)
        if problems:
            raise RecipeError(problems, source="Data(...)")
        self.load_kwargs = dict(load_kwargs or {})
        self.load_args = tuple(load_args)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.seed = seed
        self.collate_fn = collate_fn
        self.group_by_length = group_by_length
        self.keep_columns = tuple(keep_columns) if keep_columns is not None else None
        self.drop_last = drop_last
        self.num_workers = num_workers
        self._dataset = dataset

    def load(self) -> Any:
        if self._dataset is not None:
            return self._dataset
        import datasets

        from ditty._utils.errors import condensed
        from ditty.data.sources import progress_bars_on_main_rank

        self.check_files()
        try:
            with progress_bars_on_main_rank():
                loaded = datasets.load_dataset(*self.load_args, **self.load_kwargs)
        except Exception as error:  # noqa: BLE001 - a file or id the user named; say which, without a traceback
            raise RecipeError.single(
                f"datasets.load_dataset({_call_text(self.load_args, self.load_kwargs)}) failed: {condensed(error)}",
                key="Data.load_kwargs",
                fix="check the path, the files and the split",
            ) from error
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise RecipeError.single(
                    f"the dataset has splits {list(loaded)} and no 'train'",
                    key="Data.load_kwargs",
                    fix='name one: load_kwargs={..., "split": "..."}',
                )
            loaded = loaded["train"]
        return loaded

    def check_files(self) -> None:
        """Local json/csv/text files named in `data_files` are read row by row first (ditty.data.rows),
        so a malformed line, a bad encoding, a blank JSON line or an over-long line is an error
        naming its file and line rather than the parser's traceback."""
        from ditty.data.bad_rows import raise_for_bad_rows, scan_file

        builder = self.load_kwargs.get("path", self.load_args[0] if self.load_args else None)
        files = self.load_kwargs.get("data_files")
        if builder not in ("json", "csv", "text") or not files:
            return
        if isinstance(files, dict):
            files = [f for group in files.values() for f in ([group] if isinstance(group, str) else group)]
        for file in [files] if isinstance(files, str) else files:
            if isinstance(file, str) and os.path.isfile(file) and os.path.getsize(file) > 0:
                raise_for_bad_rows(
                    scan_file(file, {}), key="Data.load_kwargs", what=file, fix="correct or remove those rows"
                )

    def prepare(self, operations: Sequence[tuple[str, Callable, dict]] = ()) -> torch.utils.data.DataLoader:
        """The loaded dataset through `operations` (map, filter, ...; their progress bars on rank 0 only)."""
        from ditty.data.sources import progress_bars_on_main_rank

        dataset = self.load()
        for index, operation in enumerate(operations):
            try:
                name, function, kwargs = operation
            except (TypeError, ValueError):
                raise RecipeError.single(
                    f"operation {index} is not a (name, function, kwargs) triple",
                    key="Data.prepare",
                    fix='e.g. ("map", tokenize, {"batched": True})',
                ) from None
            method = getattr(dataset, name, None)
            if method is None:
                raise RecipeError.single(
                    f"operation {index}: a dataset has no method {name!r}",
                    key="Data.prepare",
                    fix="use a datasets.Dataset method such as map, filter, shuffle, select",
                )
            with progress_bars_on_main_rank():
                dataset = method(function, **(kwargs or {}))
        dataset = self.remove_unused_columns(dataset)
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=self.sampler(dataset),
            collate_fn=self.collate_fn or self.default_collate(),
            drop_last=self.drop_last,
            num_workers=self.num_workers,
        )

    def remove_unused_columns(self, dataset: Any) -> Any:
        columns = list(getattr(dataset, "column_names", None) or [])
        keep = self.keep_columns or (TOKEN_COLUMNS if self.tokenizer is not None and self.collate_fn is None else None)
        if not columns or keep is None:
            return dataset
        unused = [c for c in columns if c not in keep]
        return dataset.remove_columns(unused) if unused and len(unused) < len(columns) else dataset

    def sampler(self, dataset: Any) -> torch.utils.data.Sampler:
        if self.group_by_length:
            return LengthGroupedSampler(lengths_of(dataset), self.batch_size, self.seed)
        return torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(self.seed))

    def default_collate(self) -> Callable:
        if self.tokenizer is None:
            return torch.utils.data.default_collate
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return lambda samples: pad_collate(samples, pad)


def _setting_problems(load_kwargs: Any, batch_size: Any, grad_accum: Any, num_workers: Any) -> list[Problem]:
    """Values that would otherwise fail deep inside `dict()` or torch's DataLoader, named here."""
    problems = []
    if load_kwargs is not None and not isinstance(load_kwargs, dict):
        problems.append(
            Problem(
                "Data.load_kwargs",
                f"is a {type(load_kwargs).__name__}: it holds the keyword arguments of datasets.load_dataset",
                fix='Data(load_kwargs={"path": "json", "data_files": "train.jsonl", "split": "train"})',
            )
        )
    for name, value, least in (
        ("batch_size", batch_size, 1),
        ("grad_accum", grad_accum, 1),
        ("num_workers", num_workers, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            problems.append(
                Problem(
                    f"Data.{name}",
                    f"is {value!r}: it must be a whole number of at least {least}",
                    fix=f"{name}={max(least, 1)}",
                )
            )
    return problems


def _call_text(args: Sequence, kwargs: dict) -> str:
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    text = ", ".join(shown)
    return text if len(text) <= 200 else text[:197] + "..."


def pad_collate(samples: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad token columns: input_ids with the pad id, labels with -100, masks with 0."""
    batch: dict[str, torch.Tensor] = {}
    longest = max(len(s["input_ids"]) for s in samples)
    for key in samples[0]:
        values = [s[key] for s in samples]
        if key in TOKEN_COLUMNS:
            fill = pad_token_id if key == "input_ids" else IGNORE_INDEX if key == "labels" else 0
            batch[key] = torch.tensor([list(v) + [fill] * (longest - len(v)) for v in values], dtype=torch.long)
        else:
            batch[key] = torch.utils.data.default_collate(values)
    if "attention_mask" not in batch:
        lengths = torch.tensor([len(s["input_ids"]) for s in samples])
        batch["attention_mask"] = (torch.arange(longest)[None, :] < lengths[:, None]).long()
    if "labels" not in batch:
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
    return batch


def lengths_of(dataset: Any) -> list[int]:
    if "input_ids" in (getattr(dataset, "column_names", None) or []):
        return [len(ids) for ids in dataset["input_ids"]]
    return [len(sample["input_ids"]) for sample in dataset]


class LengthGroupedSampler(torch.utils.data.Sampler):
    """A seeded permutation grouped by length (`ditty.data.batching.group_by_length`, the rule the
    recipe's `data.group_by_length` uses too); a new permutation each epoch."""

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int) -> None:
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        from ditty.data.batching import group_by_length

        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.lengths))
        self.epoch += 1
        yield from group_by_length(order, self.lengths, self.batch_size).tolist()
