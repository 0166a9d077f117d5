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
from ditty.config.data import DataConfig, DataEvalConfig, DataFormat, DataSourceConfig  # noqa: F401
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
    """Log metrics every this many steps: each record holds the means over the steps since the last one
    (loss, grad_norm and the objective's metrics, rewards included) and the learning rate at its step."""
    eval_every: int = 0
    """Evaluate every this many steps (0: only at the end)."""
    eval_at_start: Optional[bool] = None
    """Evaluate before the first step too (step 0: the baseline a gain is read against). Unset: for the
    objectives after SFT (preference, reward models, RL, distillation) when `eval_every` > 0."""
    eval_samples: int = 256
    """Validation samples used for the task metric (exact match by greedy generation)."""
    stop_when: str = ""
    """End the run before `steps` once an evaluation meets this: "METRIC >= NUMBER" or "METRIC <=
    NUMBER", METRIC one of the evaluation's val_* metrics (e.g. "val_exact_match >= 0.4"). Checked
    after each evaluation (every `eval_every` steps); the run then ends as at its last step
    (checkpoint, final/), and a rerun finds it finished. "" (default): run all the steps."""
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
    kind: Literal["adamw", "radam", "adamw8bit", "sgd", "muon", "adafactor", "adamw_schedulefree"] = "adamw"
    """Optimizer algorithm. "radam": rectified Adam (AdamW's decoupled weight decay), whose first steps
    do not move every weight by the whole rate as Adam's do: the stages after SFT start from a trained
    model that such steps undo; "muon": Muon on the hidden layers' 2-D weights, AdamW on everything else,
    as one optimizer; "adafactor": torch's Adafactor (factored second moments); "adamw_schedulefree":
    schedule-free AdamW (the `schedulefree` package; needs scheduler.kind = "constant")."""
    backend: Literal["default", "torch", "torchao", "bnb", "schedulefree"] = "default"
    """Implementation: "default" is torch for adamw, radam, sgd, muon and adafactor, torchao for adamw8bit,
    schedulefree for adamw_schedulefree."""
    lr: float = 3e-4
    """Peak learning rate. For muon: the AdamW part's (muon_lr is the Muon part's)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas (adamw, adamw8bit, radam, adamw_schedulefree, and muon's AdamW part)."""
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
