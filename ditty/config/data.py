"""`[data]` and its `[[data.sources]]` and `[data.eval]` tables: what the run trains and evaluates on.

Like every section (see ditty/config/sections.py), each field's attribute docstring is its help text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

DataFormat = Literal[
    "text",
    "prompt_completion",
    "chat",
    "classification",
    "token_classification",
    "seq2seq",
    "masked_lm",
    "preference",
    "unpaired_preference",
    "prompt",
]


@dataclass(frozen=True)
class DataSourceConfig:
    """One `[[data.sources]]` entry: a source of training samples and its share of the tokens.

    Format and column keys left unset take the value of `[data]`; `data.max_seq_len`,
    `data.packing` and the data seed apply to every source."""

    source: Literal["builtin", "file", "hub"] = "file"
    """Where this source's rows come from: local files, a hub dataset, or a built-in generated dataset."""
    path: Optional[str] = None
    """Local file or glob (.jsonl, .json, .csv, .parquet, .txt) for source = "file"."""
    dataset: Optional[str] = None
    """Hub dataset id (source = "hub") or built-in dataset name (source = "builtin")."""
    split: str = "train"
    """Split of a hub dataset to train on."""
    weight: float = 1.0
    """This source's share of the training tokens, relative to the other sources' weights."""
    name: Optional[str] = None
    """Name in metrics (`tokens/source/NAME`, `val_loss/NAME`); defaults to the source's index."""
    format: Optional[DataFormat] = None
    """Sample format of this source; defaults to `data.format`."""
    text_column: Optional[str] = None
    """Column holding the text (format = "text"); defaults to `data.text_column`."""
    prompt_column: Optional[str] = None
    """Column holding the prompt (format = "prompt_completion"); defaults to `data.prompt_column`."""
    completion_column: Optional[str] = None
    """Column holding the completion (format = "prompt_completion"); defaults to `data.completion_column`."""
    messages_column: Optional[str] = None
    """Column holding the messages (format = "chat"); defaults to `data.messages_column`."""
    num_samples: Optional[int] = None
    """Size of a built-in dataset; defaults to `data.num_samples`."""
    val_path: Optional[str] = None
    """A held-out file for this source, validated on its own (`val_loss/NAME`)."""
    val_fraction: Optional[float] = None
    """Fraction of this source held out for validation when no `val_path` is given; defaults to
    `data.val_fraction` (not for streaming sources, which cannot be split before they are read)."""


@dataclass(frozen=True)
class DataEvalConfig:
    """`[data.eval]`: a held-out source of its own, validated beside any per-source held-out sets."""

    source: Literal["none", "file", "hub"] = "none"
    """Where the held-out rows come from: "none" (no separate held-out source), local files or a hub dataset."""
    path: Optional[str] = None
    """Local file or glob for source = "file"."""
    dataset: Optional[str] = None
    """Hub dataset id for source = "hub"."""
    split: str = "validation"
    """Split of the hub dataset."""
    name: str = "eval"
    """Name in metrics: `val_loss/NAME`."""
    format: Optional[DataFormat] = None
    """Sample format; defaults to `data.format`."""
    text_column: Optional[str] = None
    """Column holding the text; defaults to `data.text_column`."""
    prompt_column: Optional[str] = None
    """Column holding the prompt; defaults to `data.prompt_column`."""
    completion_column: Optional[str] = None
    """Column holding the completion; defaults to `data.completion_column`."""
    messages_column: Optional[str] = None
    """Column holding the messages; defaults to `data.messages_column`."""


@dataclass(frozen=True)
class DataConfig:
    source: Literal["builtin", "file", "hub"] = "builtin"
    """Where samples come from: a built-in generated dataset, local files, or a hub dataset."""
    name: str = "addition"
    """Built-in dataset name ("addition", "reverse", "topics") or hub dataset id (source = "hub")."""
    path: Optional[str] = None
    """Local file or glob (.jsonl, .json, .csv, .parquet, .txt) for source = "file"."""
    split: str = "train"
    """Split of a hub dataset to train on."""
    format: DataFormat = "prompt_completion"
    """"text": loss on every token; "prompt_completion": loss on the completion; "chat": loss on assistant
    turns (these three: model.task = "causal-lm"). "classification": text (or a text pair) and a label;
    "token_classification": words and one tag per word; "seq2seq": source and target; "masked_lm": text
    with random tokens masked (each for the model.task of that name). "prompt": prompts only (a string or
    chat messages in `prompt`), every other column handed to the reward functions of [rl]."""
    text_column: str = "text"
    """Column holding the text (format = "text", "classification" or "masked_lm")."""
    prompt_column: str = "prompt"
    """Column holding the prompt (format = "prompt_completion")."""
    completion_column: str = "completion"
    """Column holding the completion (format = "prompt_completion")."""
    template: Optional[Literal["alpaca"]] = None
    """A named prompt template that reads instruction rows as prompt_completion (format =
    "prompt_completion"): "alpaca" reads `instruction`, an optional `input` and `output`, and renders the
    prompt with Alpaca's text; the completion is `output`. Unset: the prompt and completion columns."""
    messages_column: str = "messages"
    """Column holding the conversation (format = "chat"). OpenAI rows ({role, content} messages in
    "messages") and ShareGPT rows ({from, value} turns, human/gpt/system, in "conversations") are
    recognised per row as they are; name another column here."""
    chat_keys: dict[str, str] = field(default_factory=dict)
    """Message keys and role names of another conversation layout (format = "chat"), e.g.
    {role = "speaker", content = "text", user = "customer", assistant = "agent", system = "rules"}:
    `role`/`content` name each message's two keys, `user`/`assistant`/`system` the speaker values that
    mean those roles (others pass through). Unset: the OpenAI and ShareGPT layouts are detected."""
    text_pair_column: Optional[str] = None
    """Column holding the second text of a pair (format = "classification"; unset: single texts)."""
    label_column: str = "label"
    """Column holding the label, a string or an integer (format = "classification")."""
    words_column: str = "tokens"
    """Column holding the list of words (format = "token_classification")."""
    tags_column: str = "tags"
    """Column holding one tag per word, strings or integers (format = "token_classification")."""
    source_column: str = "source"
    """Column holding the input text (format = "seq2seq")."""
    target_column: str = "target"
    """Column holding the output text (format = "seq2seq")."""
    max_target_len: int = 128
    """Longest target in tokens (format = "seq2seq"); longer targets are truncated from the right."""
    mask_probability: float = 0.15
    """Fraction of the tokens masked for the model to predict (format = "masked_lm"), BERT's 80/10/10 rule."""
    max_seq_len: int = 512
    """Longest sample in tokens; longer samples are truncated from the right (the end is cut)."""
    packing: bool = False
    """Pack several samples into each row; attention never crosses sample boundaries."""
    group_by_length: bool = False
    """Without packing: batch samples of similar length to waste less padding."""
    num_samples: int = 20000
    """Size of a built-in dataset (training and validation together)."""
    val_fraction: float = 0.05
    """Fraction of the data held out for validation when no `val_path` is given (0 disables)."""
    val_path: Optional[str] = None
    """A separate validation file, in the same format as the training data."""
    val_exact_match: Optional[bool] = None
    """Score validation rows from files or hub data by greedy exact match too, as `val_exact_match`:
    the first `train.eval_samples` prompts answered greedily against their reference answer (the
    completion; a chat's last assistant turn; a pair's chosen answer; a prompt row's `answer` column).
    Unset: on for the objectives after SFT (preference, RL, distillation), where a generation metric is
    the one that shows harm, off for SFT itself. Built-in data is always scored so."""
    shuffle_seed: Optional[int] = None
    """Seed of the data order; defaults to `run.seed`."""
    cache_dir: Optional[str] = None
    """Where tokenized data is cached; defaults to the datasets library's cache."""
    on_bad_rows: Literal["error", "skip"] = "error"
    """A row that cannot be used (malformed JSON, bad encoding, a missing, null or wrongly typed field, a
    blank line in JSON lines, a line over max_row_bytes): "error" stops with its file and line; "skip"
    trains without it and counts it (skipped_rows in metrics.jsonl and the run summary)."""
    max_row_bytes: int = 16_000_000
    """Longest line (one row) of a data file, in bytes; longer lines are bad rows. Files are read in
    pieces of at most this size, so one huge line cannot exhaust memory."""
    sources: list[DataSourceConfig] = field(default_factory=list)
    """Several sources mixed by weight, as [[data.sources]] tables; when given, they replace the
    single source named by `source`/`name`/`path` above."""
    eval: DataEvalConfig = field(default_factory=DataEvalConfig)
    """A separate held-out source ([data.eval]), validated beside the per-source held-out sets."""
    streaming: bool = False
    """Read the sources lazily, tokenizing and packing on the fly in bounded memory, instead of
    tokenizing everything up front. Needs `train.steps`; a resume needs the same world size and
    `num_workers` (each rank reads its own share of the rows)."""
    shuffle_buffer_size: int = 1000
    """streaming, and iterable datasets of the Python API: rows are shuffled within consecutive windows
    of this many rows (1: stream order)."""
    num_workers: int = 0
    """Background processes that read, tokenize and collate batches (0: in the training process)."""
    prefetch_factor: int = 2
    """Batches each worker prepares ahead (num_workers > 0)."""
