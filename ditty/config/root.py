"""`TrainerConfig`: the root of a recipe, one field per TOML table.

`ditty.train.Trainer.Config` is this class. A subclass with extra sections becomes the schema of
a recipe that names its trainer (`trainer = "pkg.mod:MyTrainer"`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ditty.config.distill import DistillConfig
from ditty.config.mtp import MTPConfig
from ditty.config.preference import PreferenceConfig
from ditty.config.rl import RLConfig
from ditty.config.rollout import RolloutConfig
from ditty.config.sections import (
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    Fp8Config,
    HubConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PeftConfig,
    PipelineConfig,
    QuantConfig,
    RunConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainConfig,
)


@dataclass(frozen=True)
class TrainerConfig:
    """A complete ditty recipe."""

    run: RunConfig = field(default_factory=RunConfig)
    """Name, output directory, seed and device."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Which model to train and how to build it."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Which tokenizer to use."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training and validation data."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Length of training, batch sizes, precision and the loop's intervals."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer and its hyperparameters."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Learning-rate schedule."""
    peft: PeftConfig = field(default_factory=PeftConfig)
    """Adapters (LoRA, DoRA)."""
    quant: QuantConfig = field(default_factory=QuantConfig)
    """Quantized loading of the base weights."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Distributed data parallelism."""
    fp8: Fp8Config = field(default_factory=Fp8Config)
    """FP8 training."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing and resume."""
    hub: HubConfig = field(default_factory=HubConfig)
    """Pushing to the Hugging Face Hub."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Progress bar, TensorBoard, wandb."""
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """User preprocessors, postprocessors and losses."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Standard benchmarks through lm-evaluation-harness."""
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    """Preference optimisation (DPO, IPO, SimPO, ORPO, KTO) on preference data."""
    rl: RLConfig = field(default_factory=RLConfig)
    """Reinforcement learning with rollouts in the loop (GRPO, RLOO)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How the on-policy rows sample from the policy (GRPO/RLOO, online pairs, distillation)."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """On-policy distillation from a teacher model (GKD)."""
    mtp: MTPConfig = field(default_factory=MTPConfig)
    """Multi-token prediction heads trained beside a causal LM (drafts for speculative decoding)."""
