"""Building the data of [[data.sources]], `data.streaming` and [data.eval].

Training: each source read up front as a single [data] source would be (`build_single_source`), then
mixed (`MixtureData`); or, streaming, only described (`StreamingData`), since the readers open the
sources themselves. Held-out sets, each validated and reported on its own (`val_loss/NAME`): per
source, its `val_path`, or (read up front only) its `val_fraction` split; and [data.eval]. They are
read up front in both cases: a held-out set is small, and it is read whole at every evaluation.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ditty.data.build import DataBundle, build_single_source
from ditty.data.formats import tokenize_dataset
from ditty.data.mixture import MixtureData, resolve_sources
from ditty.data.sources import load_file_dataset, load_hub_dataset
from ditty.data.streaming import StreamingData

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from ditty.config.sections import DataConfig


def build_sources(data: "DataConfig", tokenizer: "PreTrainedTokenizerBase", seed: int) -> DataBundle:
    """Training data and named held-out sets (`seed` is already the data seed)."""
    from ditty.config.sections import DataEvalConfig

    sources = resolve_sources(data)
    held_out: list[tuple[str, "Dataset"]] = []
    task = None
    if data.streaming:
        train = StreamingData(
            tuple(sources),
            tokenizer,
            window=data.shuffle_buffer_size,
            cache_dir=data.cache_dir,
            report_sources=bool(data.sources),
        )
        for source in sources:
            if source.data.val_path:
                raw = load_file_dataset(source.data.val_path, key=f"{source.key}.val_path", cache_dir=data.cache_dir)
                held_out.append((source.label, tokenize_dataset(raw, tokenizer, source.data, source_key=source.key)))
    else:
        alone = [replace(s.data, eval=DataEvalConfig(), streaming=False) for s in sources]
        bundles = [build_single_source(single, tokenizer, seed) for single in alone]
        held_out = [(s.label, b.val) for s, b in zip(sources, bundles) if b.val is not None]
        if data.sources:
            train = MixtureData([b.train for b in bundles], [s.label for s in sources], [s.weight for s in sources])
        else:
            train, task = bundles[0].train, bundles[0].task
    if data.eval.source != "none":
        held_out.append((data.eval.name, _eval_set(data, tokenizer)))
    return DataBundle(train=train, val=None, task=task, seed=seed, val_sets=tuple(held_out))


def _eval_set(data: "DataConfig", tokenizer: "PreTrainedTokenizerBase") -> "Dataset":
    """[data.eval]'s rows, tokenized in its format (unset keys as in [data])."""
    spec = data.eval
    columns = {
        name: getattr(spec, name) if getattr(spec, name) is not None else getattr(data, name)
        for name in ("format", "text_column", "prompt_column", "completion_column", "messages_column")
    }
    settings = replace(data, sources=[], **columns)
    if spec.source == "file":
        raw = load_file_dataset(spec.path, key="data.eval.path", cache_dir=data.cache_dir)
        return tokenize_dataset(raw, tokenizer, settings, source_key="data.eval.path")
    raw = load_hub_dataset(spec.dataset, split=spec.split, cache_dir=data.cache_dir)
    return tokenize_dataset(raw, tokenizer, settings, source_key="data.eval.dataset")
