"""A config registry (torchtitan style): functions returning a complete `MyTrainer.Config`.

    ditty run examples.custom_section.config_registry:greeting_digits --train.steps 20

Flags still override the returned config; `[greeting]` is a section of this experiment only.
"""

from __future__ import annotations

from ditty.config import sections as S
from examples.custom_section.trainer import GreetingConfig, MyTrainer


def greeting_digits() -> MyTrainer.Config:
    """The digits denoiser for a few hundred steps, greeting twice at the start."""
    return MyTrainer.Config(
        run=S.RunConfig(name="greeting_digits", output_dir="runs/greeting_digits", device="cpu", num_threads=1),
        model=S.ModelConfig(factory="ditty.models.denoiser:digits_denoiser"),
        data=S.DataConfig(source="builtin", name="digits", val_fraction=0.05),
        train=S.TrainConfig(steps=300, global_batch_size=64, micro_batch_size=32, log_every=50, eval_samples=0),
        optimizer=S.OptimizerConfig(lr=2e-3),
        scheduler=S.SchedulerConfig(kind="cosine", warmup_steps=10),
        logging=S.LoggingConfig(progress=False),
        pipeline=S.PipelineConfig(
            preprocessors=[S.ComponentSpec("ditty.diffusion:NoisePreProcessor", {"image_shape": [1, 8, 8]})],
            loss=[S.ComponentSpec("ditty.loss:MSELoss", {"contract": "eps:4:f32, ctx.target:4:f32 -> loss:0:f32"})],
        ),
        greeting=GreetingConfig(text="hello from the greeting section", times=2),
    )
