"""How the Trainer builds each component from its config section.

`Trainer` inherits these `build_*` methods, so a subclass replaces any one of them (a custom
tokenizer, a different data stream) without touching the loop. Each takes only the sections it
needs from `self.config`; imports of the heavy builders are deferred to the call.
"""

from __future__ import annotations

import math
import os
import random

import torch

from ditty._utils.dist import is_main_process
from ditty.config.errors import RecipeError
from ditty.metrics import build_logger
from ditty.train import env as run_env
from ditty.train.final import write_recipe
from ditty.train.precision import build_precision


class Builders:
    """Mixin of `build_*` methods; expects `self.config`, `self.world_size`, `self.rank`."""

    def build_device(self) -> torch.device:
        """cuda when asked or available ("auto"), else the CPU with one thread per available core."""
        want = self.config.run.device
        if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            return torch.device("cuda", local)
        if "OMP_NUM_THREADS" not in os.environ:
            # Oversubscribing cores (threads x local processes > cores) slows CPU matmuls a lot.
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, cores // local_procs))
        return torch.device("cpu")

    def build_seed(self) -> None:
        seed = self.config.run.seed
        random.seed(seed)
        torch.manual_seed(seed)  # also seeds CUDA
        try:
            import numpy as np

            np.random.seed(seed)
        except ImportError:
            pass

    def build_tokenizer(self):
        from ditty.data.tokenizer import build_tokenizer

        return build_tokenizer(self.config.tokenizer, self.config.model)

    def build_model(self) -> torch.nn.Module:
        """The model as `[model]` and `[quant]` describe it, then the converters (adapters) in order.

        Converters run after loading and before parallelization, compile and the optimizer, so
        the optimizer sees only the parameters they leave trainable.
        """
        from ditty.models import build_model
        from ditty.models.converters import apply_converters

        cfg = self.config
        model = build_model(cfg.model, tokenizer=self.tokenizer, device=self.device, quant=cfg.quant)
        self.converters = self.build_converters()
        model = apply_converters(model, self.converters)
        if is_main_process():
            trainable, total = run_env.count_parameters(model)
            print(f"parameters: {trainable:,} trainable of {total:,} ({100 * trainable / max(total, 1):.2f}%)")
        return model

    def build_converters(self) -> list:
        """Model rewrites from the recipe: the adapter (LoRA/DoRA) today; FP8 joins the list later."""
        cfg = self.config
        if cfg.peft.kind == "none":
            return []
        from ditty.models.adapters import LoraConverter

        # Under FSDP every block must keep one dtype, so quantized bases are not upcast there.
        return [LoraConverter(cfg.peft, upcast_quantized=cfg.parallel.kind not in ("fsdp", "hsdp"))]

    def build_data(self):
        from ditty.data import build_data

        return build_data(self.config.data, self.tokenizer, self.config.run.seed)

    def build_grad_accum(self) -> int:
        """Accumulation steps = global / (micro x data-parallel size); it must divide exactly."""
        t = self.config.train
        per_step = t.micro_batch_size * self.world_size
        if t.global_batch_size % per_step:
            raise RecipeError.single(
                f"train.global_batch_size = {t.global_batch_size} is not a multiple of micro_batch_size x world size = {per_step}",
                key="train.global_batch_size",
                fix=f"use a multiple of {per_step}, e.g. {max(per_step, t.global_batch_size // per_step * per_step)}",
            )
        return t.global_batch_size // per_step

    def build_stream(self):
        from ditty.data import BatchStream

        d, t = self.config.data, self.config.train
        return BatchStream(
            self.data.train,
            global_batch_size=t.global_batch_size,
            micro_batch_size=t.micro_batch_size,
            rank=self.rank,
            world_size=self.world_size,
            seed=self.data.seed,  # data.shuffle_seed, else run.seed (decided by build_data)
            packing=d.packing,
            max_seq_len=d.max_seq_len,
            pad_token_id=self.tokenizer.pad_token_id,
            group_by_length=d.group_by_length,
        )

    def build_total_steps(self) -> int:
        """`train.steps`, or enough steps for `train.epochs` passes over the training samples."""
        t = self.config.train
        if t.steps is not None:
            return t.steps
        return max(1, math.ceil((t.epochs or 1.0) * len(self.data.train) / t.global_batch_size))

    def build_optimizer(self) -> torch.optim.Optimizer:
        from ditty.optim import build_optimizer

        return build_optimizer(self.config.optimizer, self.model)

    def build_scheduler(self):
        from ditty.optim import build_scheduler

        return build_scheduler(self.config.scheduler, self.optimizer, self.total_steps)

    def build_precision(self):
        return build_precision(self.config.train.precision, self.device)

    def build_run_dir(self) -> str:
        """Create the run directory and write recipe.toml and env.json (rank 0)."""
        run_dir = self.config.run.output_dir
        if is_main_process():
            os.makedirs(run_dir, exist_ok=True)
            info = run_env.environment(self.model, world_size=self.world_size, seed=self.config.run.seed, device=self.device,
                                       extra={"grad_accum": self.grad_accum, "total_steps": self.total_steps})
            run_env.write_env(run_dir, info)  # first: it marks the directory as a ditty run
            write_recipe(run_dir, self.config, self.trainer_ref())
        return run_dir

    def build_logger(self):
        return build_logger(self.config.logging, self.run_dir, run_name=self.config.run.name)

    def trainer_ref(self):
        """"pkg.mod:Class" of a Trainer subclass (recorded in recipe.toml), None for ditty's own."""
        cls = type(self)
        if cls.__module__ == "ditty.train.trainer":
            return None
        return f"{cls.__module__}:{cls.__qualname__}"
