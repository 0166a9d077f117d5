"""The digits diffusion recipe (recipes/digits_diffusion.toml) written with the Python API.

The same Trainer runs it; the objects are Python ones: the denoiser instance, a dataset of 8x8
digit images, the noising stage, the MSE loss, and the task that draws samples into samples.png.

    python -m examples.diffusion_pipeline [OUTPUT_DIR] [STEPS]
"""

from __future__ import annotations

import sys

from ditty.data.digits import DigitsTask, ImageDataset, load_digit_images
from ditty.diffusion import NoisePreProcessor
from ditty.loss import MSELoss
from ditty.models.denoiser import digits_denoiser
from ditty.pipeline import ModelFactory, Pipeline


def main(output_dir: str = "runs/diffusion_pipeline", steps: int = 3000, samples: int = 100):
    images, labels = load_digit_images()
    train, val = images[:1700], images[1700:]
    pipeline = Pipeline(
        model_factory=ModelFactory.from_instance(digits_denoiser()),
        dataset=ImageDataset(train),
        val_dataset=ImageDataset(val),
        preprocessors=[NoisePreProcessor(max_timesteps=1000, schedule_type="cosine", image_shape=(1, 8, 8))],
        loss_calculator=MSELoss(contract="eps:4:f32, ctx.target:4:f32 -> loss:0:f32"),
        task=DigitsTask(reference=train, labels=labels[:1700], num_samples=samples),
        output_dir=output_dir,
        lr=2e-3,
        lr_schedule="cosine",
        warmup_steps=max(1, steps // 20),
        steps=steps,
        batch_size=128,
        device="cpu",
        num_threads=1,  # a tiny MLP: one thread is several times faster than two on a busy CPU
        progress=False,
        log_every=max(1, steps // 10),
    )
    return pipeline.run()


if __name__ == "__main__":
    main(*sys.argv[1:2], *(int(a) for a in sys.argv[2:3]))
