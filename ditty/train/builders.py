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
            return self.build_process_group(torch.device("cuda", local))
        if "OMP_NUM_THREADS" not in os.environ:
            # Oversubscribing cores (threads x local processes > cores) slows CPU matmuls a lot.
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, cores // local_procs))
        return self.build_process_group(torch.device("cpu"))

    def build_process_group(self, device: torch.device) -> torch.device:
        """Under torchrun: join the process group and build the mesh (`self.dist_info`, `self.mesh`)
        before anything heavy, so a rank that cannot join fails first. One process: mesh None."""
        from ditty.train import distributed

        self.dist_info, self.mesh = distributed.setup(self.config, device)
        self.world_size, self.rank = self.dist_info.world_size, self.dist_info.rank
        return device

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
        """The recipe's tokenizer; None for non-text data (built-in images, a Python API dataset)
        unless a tokenizer source is named."""
        from ditty.data.build import IMAGE_BUILTINS
        from ditty.data.tokenizer import build_tokenizer

        cfg, components = self.config, getattr(self, "components", None)
        non_text = (components is not None and components.has_data) or (
            cfg.data.source == "builtin" and cfg.data.name in IMAGE_BUILTINS
        )
        if non_text and cfg.tokenizer.kind == "auto" and not cfg.tokenizer.source(cfg.model):
            return None
        return build_tokenizer(cfg.tokenizer, cfg.model)

    def build_model(self) -> torch.nn.Module:
        """The model as `[model]` and `[quant]` describe it, then the converters (adapters) in order.

        Converters run after loading and before parallelization, compile and the optimizer, so
        the optimizer sees only the parameters they leave trainable.
        """
        from ditty.models import build_model
        from ditty.models.converters import apply_converters

        cfg = self.config
        given = getattr(getattr(self, "components", None), "model", None)  # a Python API model instance
        if given is not None:
            model = given.to(self.device)
        else:
            from ditty.train import distributed

            # fsdp/hsdp full finetune of a local checkpoint: meta parameters now, each rank's shard
            # read after sharding (build_parallel), so no rank ever holds the whole model. QLoRA
            # (4-bit base + LoRA): rank 0 loads and quantizes, the others build on meta, and rank 0
            # sends the shards after sharding.
            self.meta_source = distributed.meta_build_source(cfg, getattr(self, "components", None))
            model = distributed.build_on_meta(cfg, self.tokenizer, self.device) if self.meta_source else None
            if model is None:
                self.meta_source = None
                model = build_model(cfg.model, tokenizer=self.tokenizer, device=self.device, quant=cfg.quant)
        self.converters = self.build_converters()
        model = apply_converters(model, self.converters)
        self._meta_rank0_tensors = None
        if getattr(self, "meta_source", None) and given is None and cfg.quant.kind != "none":
            from ditty.train import distributed

            # Rank 0's full (quantized) tensors, adapters included, kept until build_parallel sends them.
            self._meta_rank0_tensors = distributed.rank0_full_tensors(model)
        if is_main_process():
            trainable, total = run_env.count_parameters(model)
            print(f"parameters: {trainable:,} trainable of {total:,} ({100 * trainable / max(total, 1):.2f}%)")
        return model

    def build_parallel(self, model: torch.nn.Module) -> torch.nn.Module:
        """`[parallel]`: DDP, or FSDP2/HSDP shards on `self.mesh` (unchanged on one process). After the
        converters, before the optimizer; a meta-built model then loads its shards (rank 0 reads)."""
        from ditty.train import distributed

        model = distributed.parallelize(model, self.config, getattr(self, "mesh", None))
        if getattr(self, "meta_source", None):
            model = distributed.load_meta_weights(
                model,
                self.meta_source,
                self.device,
                rank0_tensors=getattr(self, "_meta_rank0_tensors", None),
                quantized=self.config.quant.kind != "none",
            )
            self._meta_rank0_tensors = None  # sent (and emptied) by the load
        return model

    def build_converters(self) -> list:
        """Model rewrites applied in order: `model.converters`, or by default the adapter (LoRA/DoRA)
        then FP8 linears. A "package.module:Class" entry is built without arguments (the compiler
        checked it: rule model.converters)."""
        from ditty.train.distributed import SHARDED_KINDS

        cfg = self.config
        sharded = cfg.parallel.kind in SHARDED_KINDS
        builtin = {}
        if cfg.peft.kind != "none":
            from ditty.models.adapters import LoraConverter

            # Under FSDP every block must keep one dtype, so quantized bases are not upcast there.
            builtin["peft"] = lambda: LoraConverter(cfg.peft, upcast_quantized=not sharded)
        if cfg.fp8.enabled:
            from ditty.models.float8 import Float8Converter

            builtin["fp8"] = lambda: Float8Converter(cfg.fp8, fsdp=sharded)
        order = list(getattr(cfg.model, "converters", None) or builtin)
        converters = []
        for name in order:
            if name in builtin:
                converters.append(builtin[name]())
            elif ":" in name:
                import importlib

                module, _, attr = name.partition(":")
                converters.append(getattr(importlib.import_module(module), attr)())
            else:
                raise RecipeError.single(
                    f"model.converters lists {name!r}, which is not configured",
                    key="model.converters",
                    fix="run `ditty check` on the recipe",
                )
        return converters

    def build_threads(self) -> None:
        """`run.num_threads` CPU threads for torch (0 leaves build_device's choice). Tiny models
        (the digits denoiser) train several times faster on one thread of a busy CPU."""
        threads = getattr(self.config.run, "num_threads", 0)
        if threads and self.device.type == "cpu":
            torch.set_num_threads(threads)

    def build_data(self):
        """The recipe's [data], or the Python API's dataset/dataloader (generic data, see ditty.data.generic)."""
        components = getattr(self, "components", None)
        if components is not None and components.has_data:
            from ditty.data.generic import GenericData

            seed = self.config.data.shuffle_seed if self.config.data.shuffle_seed is not None else self.config.run.seed
            return GenericData(
                train=components.dataloader if components.dataloader is not None else components.dataset,
                val=components.val_dataset,
                task=components.task,
                seed=seed,
                collate_fn=components.collate_fn,
            )
        from ditty.data import build_data

        data = build_data(self.config.data, self.tokenizer, self.config.run.seed)
        if components is not None and components.task is not None and getattr(data, "generic", False):
            from dataclasses import replace

            data = replace(data, task=components.task)
        return data

    def build_pipeline(self):
        """[pipeline] from the recipe; Python API instances replace the matching parts. Generic data
        has no default loss (the causal-LM loss needs token labels)."""
        from ditty.train.pipeline import Pipeline, build_pipeline

        cfg, components = self.config.pipeline, getattr(self, "components", None)
        pipeline = build_pipeline(cfg)
        if components is not None:
            pipeline = Pipeline(
                components.preprocessors if components.preprocessors is not None else pipeline.preprocessors,
                components.postprocessors if components.postprocessors is not None else pipeline.postprocessors,
                components.loss if components.loss is not None else pipeline.loss,
            )
        no_loss = not cfg.loss and (components is None or components.loss is None)
        spec = getattr(self.model, "ditty_spec", None)  # a ditty.models.registry.ModelSpec brings its loss
        if no_loss and spec is not None and spec.make_loss() is not None:
            pipeline, no_loss = Pipeline(pipeline.preprocessors, pipeline.postprocessors, spec.make_loss()), False
        if getattr(self.data, "generic", False) and no_loss:
            raise RecipeError.single(
                "non-text data needs a loss: the default causal-LM loss needs token labels",
                key="pipeline.loss",
                fix='add [[pipeline.loss]] use = "ditty.loss:MSELoss" (or pass loss_calculator=)',
            )
        return pipeline

    def build_grad_accum(self) -> int:
        """Accumulation steps = global / (micro x data-parallel size); it must divide exactly."""
        t = self.config.train
        per_step = t.micro_batch_size * self.world_size
        if t.global_batch_size % per_step:
            raise RecipeError.single(
                f"train.global_batch_size = {t.global_batch_size} is not a multiple of micro_batch_size x "
                f"world size = {per_step}",
                key="train.global_batch_size",
                fix=f"use a multiple of {per_step}, e.g. {max(per_step, t.global_batch_size // per_step * per_step)}",
            )
        return t.global_batch_size // per_step

    def build_stream(self):
        d, t = self.config.data, self.config.train
        if getattr(self.data, "generic", False):
            from ditty.data.generic import GenericStream, LoaderStream

            if self.data.is_loader:
                return LoaderStream(self.data.train, accumulation_steps=self.grad_accum)
            return GenericStream(
                self.data.train,
                global_batch_size=t.global_batch_size,
                micro_batch_size=t.micro_batch_size,
                rank=self.rank,
                world_size=self.world_size,
                seed=self.data.seed,
                collate_fn=self.data.collate_fn,
            )
        # datascale (#18): one source, a [[data.sources]] mixture or a stream, with data.num_workers;
        # the seed is data.shuffle_seed, else run.seed (decided by build_data).
        from ditty.data.build import build_stream

        return build_stream(
            self.data,
            d,
            global_batch_size=t.global_batch_size,
            micro_batch_size=t.micro_batch_size,
            rank=self.rank,
            world_size=self.world_size,
            pad_token_id=self.tokenizer.pad_token_id,
        )

    def build_total_steps(self) -> int:
        """`train.steps`, or enough steps for `train.epochs` passes over the training samples."""
        t = self.config.train
        if t.steps is not None:
            return t.steps
        return max(1, math.ceil((t.epochs or 1.0) * self.train_samples() / t.global_batch_size))

    def train_samples(self) -> int:
        """Training samples per epoch (a DataLoader counts its dataset's samples, not its batches)."""
        if getattr(self.data, "generic", False) and self.data.is_loader:
            from ditty.data.generic import loader_samples

            return loader_samples(self.data.train)
        return len(self.data.train)

    def build_optimizer(self) -> torch.optim.Optimizer:
        from ditty.optim import build_optimizer

        return build_optimizer(self.config.optimizer, self.model)

    def build_scheduler(self):
        from ditty.optim import build_scheduler

        return build_scheduler(self.config.scheduler, self.optimizer, self.total_steps)

    def build_engine(self):
        """`parallel.kind = "deepspeed"`: wrap the model and optimizer in a DeepSpeed engine, which then
        stands for both (`self.model` is the engine; `self.optimizer` its ZeRO optimizer, whose param
        groups are the torch optimizer's, so the LR scheduler built on that one still drives it).
        None for every other kind."""
        if self.config.parallel.kind != "deepspeed":
            return None
        from ditty.train import deepspeed_engine

        engine, self.optimizer = deepspeed_engine.initialize(
            self.model,
            self.optimizer,
            self.config,
            accumulation_steps=self.grad_accum,
            world_size=self.world_size,
            device=self.device,
        )
        self.model = engine
        self._deepspeed_skipped = engine.skipped_steps  # finish_step reports the steps the engine skips after this
        return engine

    def build_precision(self):
        precision = build_precision(self.config.train.precision, self.device)
        if self.config.parallel.kind == "deepspeed":
            precision.scaler = None  # the engine scales fp16 losses itself ("fp16": {"loss_scale": 0})
        return precision

    def build_run_dir(self) -> str:
        """Create the run directory and write recipe.toml and env.json (rank 0)."""
        run_dir = self.config.run.output_dir
        if is_main_process():
            os.makedirs(run_dir, exist_ok=True)
            info = run_env.environment(
                self.model,
                world_size=self.world_size,
                seed=self.config.run.seed,
                device=self.device,
                extra={"grad_accum": self.grad_accum, "total_steps": self.total_steps},
            )
            run_env.write_env(run_dir, info)  # first: it marks the directory as a ditty run
            write_recipe(run_dir, self.config, self.trainer_ref())
            if getattr(self, "components", None) is not None:
                from ditty.train.components import annotate_recipe

                annotate_recipe(run_dir, self.components)  # says the file alone cannot re-run this
        return run_dir

    def build_logger(self):
        """metrics.jsonl and friends; a resumed run appends after the records up to its checkpoint."""
        resume = getattr(self, "resume", None)
        resuming = resume is not None and resume.checkpoint is not None
        if resuming:
            from ditty.train.checkpointing import truncate_metrics

            truncate_metrics(self.run_dir, resume.step)
        return build_logger(self.config.logging, self.run_dir, run_name=self.config.run.name, append=resuming)

    def trainer_ref(self):
        """ "pkg.mod:Class" of a Trainer subclass (recorded in recipe.toml), None for ditty's own."""
        cls = type(self)
        if cls.__module__ == "ditty.train.trainer":
            return None
        return f"{cls.__module__}:{cls.__qualname__}"
