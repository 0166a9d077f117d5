"""The recipe sections: one frozen dataclass per TOML table.

Every field has a type, a default where one makes sense, and an attribute docstring. The docstrings
are the single source of help text: tyro shows them in `--help`, `ditty init` writes them as
comments. A choice is a Literal `kind`; the options of every kind are plain fields of the same
section, and the compiler warns about an option the chosen kind ignores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

# Sections kept in modules of their own; imported here so every section still imports from this module.
from ditty.config.outputs import CheckpointConfig, EvalConfig, HubConfig, LoggingConfig  # noqa: F401
from ditty.config.scale import SHARDED_KINDS, Fp8Config, ParallelConfig, PeftConfig, QuantConfig  # noqa: F401

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
ModelTaskName = Literal[
    "causal-lm", "seq-classification", "token-classification", "seq2seq", "masked-lm", "reward-model"
]
"""What a model is trained to do; ditty/models/tasks.py maps each to its Auto class, data format, loss and metrics."""


@dataclass(frozen=True)
class RunConfig:
    name: str = "ditty"
    """A short name for the run, used in logs and model cards."""
    output_dir: str = "runs/ditty"
    """Run directory: resolved recipe, metrics, checkpoints and the final model go here."""
    seed: int = 0
    """Seed for model initialisation, data order and dropout."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: "auto" takes CUDA when available, else the CPU."""
    num_threads: int = 0
    """CPU threads for torch; 0 lets ditty choose: a rule to start (1 for a model under 20M parameters,
    else the cores other work leaves free, per local process), then a single-process run of 500
    steps or more times its first steps on all cores and on 1 and keeps the faster."""


@dataclass(frozen=True)
class ModelConfig:
    path: Optional[str] = None
    """Hugging Face hub id or local directory of a pretrained model (or of the architecture for random init)."""
    task: ModelTaskName = "causal-lm"
    """What the model learns: "causal-lm" (next token), "seq-classification" (a label per text),
    "token-classification" (a tag per word), "seq2seq" (encoder-decoder, source -> target),
    "masked-lm" (masked tokens) or "reward-model" (one score per text, trained on preference pairs). It picks
    the transformers Auto class, the data format, loss and metrics."""
    init: Literal["auto", "pretrained", "random"] = "auto"
    """"pretrained" loads weights from `path`; "random" builds the architecture with fresh weights;
    "auto" is pretrained when `path` is set, else random."""
    architecture: Optional[str] = None
    """For random init without `path`: a transformers model type such as "llama", "mistral", "gpt_neox", "qwen2"."""
    config: dict[str, Any] = field(default_factory=dict)
    """Overrides applied to the model's config, e.g. {hidden_size = 128, num_hidden_layers = 4}."""
    dtype: Dtype = "auto"
    """How weights are stored: "auto" keeps fp32 on CPU and the checkpoint's dtype on GPU."""
    factory: Optional[str] = None
    """"package.module:function" returning an nn.Module, for custom (non Hugging Face) models."""
    factory_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to `factory`."""
    trust_remote_code: bool = False
    """Allow code shipped with a hub model to run. Off unless you trust the repository."""
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2", "flex_attention"] = "auto"
    """Attention kernel of Hugging Face models; "auto" lets transformers choose. With packing, sdpa
    and eager attend within each sample, flash_attention_2 (CUDA) gets the samples' cumulative
    lengths and flex_attention a block-sparse mask: no T x T tensor for most model types."""
    packed_attention: Literal["auto", "dense", "per-sample"] = "auto"
    """How packed rows of sdpa/eager models keep samples apart: "dense" (a block-diagonal [T, T] mask),
    "per-sample" (causal SDPA sample by sample, no [T, T] tensor) or "auto": the dense mask for rows of
    up to 256 tokens on the CPU, where it is faster, else per-sample. `ditty check` prints the choice."""
    converters: list[str] = field(default_factory=list)
    """Model rewrites in the order they apply (after loading, before parallelization): "peft" (the
    [peft] adapter), "fp8" (the float8 linears of [fp8]) or "package.module:Class" (a
    ditty.models.converters.ModelConverter built without arguments). Empty: the configured ones,
    peft then fp8."""

    @property
    def resolved_init(self) -> Literal["pretrained", "random"]:
        if self.init == "auto":
            return "pretrained" if self.path else "random"
        return self.init


@dataclass(frozen=True)
class TokenizerConfig:
    kind: Literal["auto", "byte"] = "auto"
    """"auto" loads `path` or the model's tokenizer, or the byte tokenizer when neither exists;
    "byte" is a built-in byte-level tokenizer needing no files."""
    path: Optional[str] = None
    """Tokenizer hub id or directory; defaults to `model.path`."""
    chat_template: Optional[str] = None
    """The chat template to use (data.format = "chat", `ditty generate --chat`) instead of the
    tokenizer's own, for tokenizers that have none: "chatml", "plain" ("role: content" lines), or the
    path of a Jinja file. It is saved with the tokenizer in the run's checkpoints and final/."""

    def source(self, model: "ModelConfig") -> Optional[str]:
        """Where the tokenizer loads from, or None for the built-in byte tokenizer."""
        if self.kind == "byte":
            return None
        return self.path or model.path


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


@dataclass(frozen=True)
class TrainConfig:
    steps: Optional[int] = None
    """Optimizer steps to run; when set it wins over `epochs`."""
    epochs: float = 1.0
    """Passes over the training data, used when `steps` is not set."""
    global_batch_size: int = 32
    """Samples per optimizer step across all ranks; accumulation is derived from it."""
    micro_batch_size: int = 8
    """Samples per forward pass on each rank."""
    max_grad_norm: float = 1.0
    """Clip the gradient norm to this value; 0 disables clipping (the norm is still logged)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Compute precision: autocast (or FSDP mixed precision) dtype. fp16 uses dynamic loss scaling."""
    log_every: int = 10
    """Log metrics every this many steps."""
    eval_every: int = 0
    """Evaluate every this many steps (0: only at the end)."""
    eval_at_start: Optional[bool] = None
    """Evaluate before the first step too (step 0: the baseline a gain is read against). Unset: for the
    objectives after SFT (preference, reward models, RL, distillation) when `eval_every` > 0."""
    eval_samples: int = 256
    """Validation samples used for the task metric (exact match by greedy generation)."""
    max_skipped_steps: int = 10
    """Stop after this many consecutive steps with a non-finite loss or gradient."""
    compile: bool = False
    """torch.compile the model (see `compile_scope`)."""
    compile_scope: Literal["blocks", "model"] = "blocks"
    """Compile each transformer block ("blocks") or the whole model ("model")."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """torch.compile's mode: "reduce-overhead" adds CUDA graphs, "max-autotune" searches kernels (slow to compile)."""
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    """Recompute activations in the backward pass to save memory."""
    loss_chunks: int = 0
    """Causal LM: cross-entropy from the final hidden states and the output projection in this many
    chunks of a micro-batch's tokens, never holding the full [tokens, vocab] logits or their
    gradient (0: full logits). Saves gigabytes with large vocabularies and long sequences."""
    loss_backend: Literal["auto", "chunked", "liger", "cce"] = "auto"
    """With loss_chunks > 0: "chunked" (pure PyTorch, any device), "liger" (liger-kernel) or "cce"
    (cut-cross-entropy), the last two on CUDA only; "auto" takes liger, then cce, when installed
    and training on CUDA, else chunked."""

    def accumulation_steps(self, data_parallel_size: int) -> Optional[int]:
        """Micro-batches per rank per optimizer step: global / (micro x data-parallel size); None when
        that does not divide exactly (the compiler's rule batch.divisible reports it)."""
        per_pass = self.micro_batch_size * data_parallel_size
        if per_pass <= 0 or self.global_batch_size <= 0 or self.global_batch_size % per_pass:
            return None
        return self.global_batch_size // per_pass


@dataclass(frozen=True)
class OptimizerConfig:
    kind: Literal["adamw", "adamw8bit", "sgd", "muon", "adafactor", "adamw_schedulefree"] = "adamw"
    """Optimizer algorithm. "muon": Muon on the hidden layers' 2-D weights, AdamW on everything else,
    as one optimizer; "adafactor": torch's Adafactor (factored second moments); "adamw_schedulefree":
    schedule-free AdamW (the `schedulefree` package; needs scheduler.kind = "constant")."""
    backend: Literal["default", "torch", "torchao", "bnb", "schedulefree"] = "default"
    """Implementation: "default" is torch for adamw, sgd, muon and adafactor, torchao for adamw8bit,
    schedulefree for adamw_schedulefree."""
    lr: float = 3e-4
    """Peak learning rate. For muon: the AdamW part's (muon_lr is the Muon part's)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas (adamw, adamw8bit, adamw_schedulefree, and muon's AdamW part)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (never applied to the parameters `no_decay` names)."""
    eps: float = 1e-8
    """Adam epsilon."""
    momentum: float = 0.0
    """SGD momentum (kind = "sgd")."""
    no_decay: list[str] = field(default_factory=lambda: ["bias", "norm", "embedding"])
    """Parameters without weight decay: the roles "bias", "norm", "embedding" (from the module types;
    a head tied to the embedding is the embedding) and/or regular expressions searched in the
    parameter name (e.g. "lora_"). [] decays everything."""
    lr_multipliers: dict[str, float] = field(default_factory=dict)
    """Learning-rate factors: {pattern = factor}, a pattern being a role ("bias", "norm",
    "embedding", "head") or a regular expression searched in the parameter name; the first
    matching pattern wins. E.g. { classifier = 10.0 } or LoRA+'s { lora_B = 16.0 }."""
    muon_lr: float = 0.02
    """muon: learning rate of the Muon part (torch.optim.Muon's lr; the schedule scales it too)."""
    muon_weight_decay: Optional[float] = None
    """muon: weight decay of the Muon part (default: weight_decay)."""
    muon_momentum: float = 0.95
    """muon: Muon's momentum (Nesterov)."""
    ns_steps: int = 5
    """muon: Newton-Schulz iterations per step."""
    adjust_lr_fn: Literal["original", "match_rms_adamw"] = "original"
    """muon: how the update is scaled per matrix shape: "original" (Keller Jordan's sqrt(max(1, rows/cols)))
    or "match_rms_adamw" (Moonshot's 0.2 sqrt(max(rows, cols)): the AdamW lr then suits muon_lr too)."""
    ns_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """muon: dtype of the Newton-Schulz products. "auto": bfloat16 on GPUs (torch.optim.Muon's choice),
    and on the CPU whichever a measured product finds faster (float32 on CPUs without bfloat16 units,
    where bfloat16 products run 20-40x slower); the update agrees with bfloat16's to its precision."""


@dataclass(frozen=True)
class SchedulerConfig:
    kind: Literal["constant", "linear", "cosine", "wsd"] = "cosine"
    """Learning-rate shape after warmup: constant, linear decay, cosine decay, or warmup-stable-decay."""
    warmup_steps: int = 0
    """Steps of linear warmup from zero."""
    min_lr_ratio: float = 0.0
    """Final learning rate as a fraction of the peak (linear, cosine, wsd)."""
    decay_fraction: float = 0.2
    """For wsd: fraction of the steps spent in the final decay."""


@dataclass(frozen=True)
class ComponentSpec:
    use: str
    """"package.module:Class" of the component."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for its constructor."""
    weight: float = 1.0
    """Weight of this part when it is one term of a composite loss."""


@dataclass(frozen=True)
class PipelineConfig:
    preprocessors: list[ComponentSpec] = field(default_factory=list)
    """Preprocessors applied to each batch before model.forward, in order."""
    postprocessors: list[ComponentSpec] = field(default_factory=list)
    """Postprocessors applied to the model output, in order."""
    loss: list[ComponentSpec] = field(default_factory=list)
    """Loss calculator(s); several entries form a weighted composite loss. Empty: causal-LM loss."""
    check_tensors: bool = True
    """Compare the first micro-batch's real tensors with every stage's declared contract (a
    mismatch stops the run, naming the stage)."""
