"""Run the subclassed Trainer (`MyTrainer`, with its own `[greeting]` section) from a script.

    python -m examples.custom_section.run [OUTPUT_DIR] [STEPS]

The same experiment from the command line: `ditty run examples.custom_section.config_registry:greeting_digits`,
or a TOML recipe that starts with `trainer = "examples.custom_section.trainer:MyTrainer"`.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from examples.custom_section.config_registry import greeting_digits
from examples.custom_section.trainer import MyTrainer


def main(output_dir: str = "runs/greeting_digits", steps: int = 300):
    config = greeting_digits()
    config = replace(
        config,
        run=replace(config.run, output_dir=output_dir),
        train=replace(config.train, steps=steps),
        scheduler=replace(config.scheduler, warmup_steps=min(config.scheduler.warmup_steps, steps // 2)),
    )
    return MyTrainer(config).train()


if __name__ == "__main__":
    main(*sys.argv[1:2], *(int(a) for a in sys.argv[2:3]))
