"""Several sources in one run ([[data.sources]]): which source each sample comes from.

Weights are shares of the training TOKENS. The next sample comes from the source furthest behind
its share (the largest `weight x tokens so far - tokens of this source`), ties to the larger
weight, then to the lower index: Megatron-LM's blending rule, counted in tokens rather than in
samples. So the mix is deterministic, needs no random draw, and every source is within one sample's
length of its share at every point; the seed shuffles each source's own order.

`MixtureStream` plans that mix on the ONE global order shared by all ranks, as `BatchStream` does
for one source (see batching.py): every rank plans every row from the sample lengths and fetches
only the tokens of its own, so the stream does not depend on the world size and resumes from its
state on any world size. Streaming sources mix with the same `TokenMixer`, per reader
(ditty/data/streaming.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ditty.config.errors import RecipeError
from ditty.data.batching import BatchStream, sample_lengths
from ditty.data.collate import fetch_rows

if TYPE_CHECKING:
    from ditty.config.sections import DataConfig, DataSourceConfig


@dataclass(frozen=True)
class ResolvedSource:
    """One source with the [data] defaults filled in: `data` reads like a single-source [data]."""

    index: int
    label: str
    """Its name in metrics: the source's `name`, else its index."""
    weight: float
    """Normalised: the weights of all sources add up to 1."""
    data: "DataConfig"
    key: str
    """The recipe key that names it, for error messages: "data.sources.0"."""


def resolve_sources(data: "DataConfig") -> list[ResolvedSource]:
    """The [[data.sources]] of a recipe as single-source configs; [data] itself when there are none."""
    if not data.sources:
        return [ResolvedSource(0, "data", 1.0, data, "data")]
    total = sum(source.weight for source in data.sources)
    return [
        ResolvedSource(
            index,
            source.name or str(index),
            source.weight / total,
            _as_single_source(data, source),
            f"data.sources.{index}",
        )
        for index, source in enumerate(data.sources)
    ]


def _as_single_source(data: "DataConfig", source: "DataSourceConfig") -> "DataConfig":
    """[data] with this source's keys in place of the single-source ones (unset keys inherit)."""

    def pick(own: Any, inherited: Any) -> Any:
        return inherited if own is None else own

    name = source.dataset if source.dataset is not None else data.name
    return replace(
        data,
        source=source.source,
        name=name,
        path=source.path,
        split=source.split,
        format=pick(source.format, data.format),
        text_column=pick(source.text_column, data.text_column),
        prompt_column=pick(source.prompt_column, data.prompt_column),
        completion_column=pick(source.completion_column, data.completion_column),
        messages_column=pick(source.messages_column, data.messages_column),
        num_samples=pick(source.num_samples, data.num_samples),
        val_path=source.val_path,
        val_fraction=pick(source.val_fraction, data.val_fraction),
        sources=[],
    )


class TokenMixer:
    """The mixing rule of the module doc: which source gives the next sample, from tokens taken so far."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.weights = np.asarray(weights, dtype=np.float64)
        self.tokens = [0] * len(self.weights)
        # Ties go to the larger weight, then the lower index: a stable sort of -weight gives that order.
        self._tie_order = np.argsort(-self.weights, kind="stable")

    def pick(self) -> int:
        total = sum(self.tokens)
        behind = self.weights * total - np.asarray(self.tokens, dtype=np.float64)
        ordered = behind[self._tie_order]
        return int(self._tie_order[int(np.argmax(ordered))])

    def add(self, source: int, tokens: int) -> None:
        self.tokens[source] += int(tokens)

    def state_dict(self) -> dict[str, list[int]]:
        return {"tokens": list(self.tokens)}

    def load_state_dict(self, state: dict[str, list[int]]) -> None:
        self.tokens = [int(t) for t in state["tokens"]]


class MixtureData:
    """Tokenized datasets of several sources, addressed as one: sample k of source s is
    `offsets[s] + k`. Its length (all samples of all sources) is what `train.epochs` counts."""

    def __init__(self, datasets: Sequence[Any], labels: Sequence[str], weights: Sequence[float]) -> None:
        self.datasets = list(datasets)
        self.labels = list(labels)
        self.weights = list(weights)
        self.sizes = [len(d) for d in self.datasets]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """(source, index within that source) of a global sample index."""
        source = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return source, index - int(self.offsets[source])


class MixtureStream(BatchStream):
    """`BatchStream` over a `MixtureData`: the global order takes the next sample of the source the
    `TokenMixer` picks; each source follows its own seeded permutation, a new one per pass over it."""

    def __init__(self, mixture: MixtureData, **stream: Any) -> None:
        stream.pop("group_by_length", None)  # the order is the mixer's; the compiler warns that this has no effect
        lengths = np.concatenate([sample_lengths(d) for d in mixture.datasets])
        self.mixture = mixture
        self.mixer = TokenMixer(mixture.weights)
        self.taken = [0] * len(mixture.datasets)
        self._source_orders: dict[tuple[int, int], np.ndarray] = {}
        super().__init__(mixture, lengths=lengths, **stream)

    # ---- the global order: the mixer's pick replaces one permutation's next index ------------------

    def _peek(self) -> int:
        source = self.mixer.pick()
        epoch, position = divmod(self.taken[source], self.mixture.sizes[source])
        return int(self.mixture.offsets[source]) + int(self._source_order(source, epoch)[position])

    def _take(self) -> int:
        index = self._peek()
        source, _ = self.mixture.locate(index)
        self.taken[source] += 1
        self.mixer.add(source, int(self._lengths[index]))
        self.cursor += 1
        return index

    def _source_order(self, source: int, epoch: int) -> np.ndarray:
        """One source's permutation for one pass over it (two passes of each source are kept)."""
        key = (source, epoch)
        if key not in self._source_orders:
            order = np.random.default_rng([self.seed, source, epoch]).permutation(self.mixture.sizes[source])
            self._source_orders = {k: o for k, o in self._source_orders.items() if k[0] != source or k[1] == epoch - 1}
            self._source_orders[key] = order
        return self._source_orders[key]

    def _fetch(self, indices: list[int]) -> list:
        """The samples of global indices, read source by source (one columnar read each)."""
        located = [self.mixture.locate(i) for i in indices]
        out: list = [None] * len(indices)
        for source, dataset in enumerate(self.mixture.datasets):
            positions = [n for n, (s, _) in enumerate(located) if s == source]
            if not positions:
                continue
            samples = fetch_rows(dataset, [located[n][1] for n in positions])
            for position, sample in zip(positions, samples):
                out[position] = sample
        return out

    # ---- position ----------------------------------------------------------------------------------

    def source_tokens(self) -> dict[str, int]:
        """Tokens each source has put into training so far, all ranks together (the plan is global)."""
        return dict(zip(self.mixture.labels, self.mixer.tokens))

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "sizes": list(self.mixture.sizes),
            "taken": list(self.taken),
            "mixer": self.mixer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "sizes" not in state:
            raise RecipeError.single(
                "the checkpoint was trained on a single data source, this recipe mixes [[data.sources]]",
                key="data.sources",
                fix='resume with the checkpoint\'s [data], or start afresh (checkpoint.resume = "never")',
            )
        if list(state["sizes"]) != self.mixture.sizes:
            raise RecipeError.single(
                f"the checkpoint's sources held {state['sizes']} samples, these hold {self.mixture.sizes}",
                key="data.sources",
                fix='resume on the data the checkpoint was trained on, or start afresh (checkpoint.resume = "never")',
            )
        super().load_state_dict(state)
        self.taken = [int(t) for t in state["taken"]]
        self.mixer.load_state_dict(state["mixer"])


def source_token_record(stream: Any) -> dict[str, int]:
    """`tokens/source/NAME` for metrics.jsonl: tokens each source put into training so far (summed
    over ranks). Empty for a single-source stream. Collective for a streaming run: call it on every
    rank at the same step."""
    return {f"tokens/source/{label}": count for label, count in stream.source_tokens().items()}
