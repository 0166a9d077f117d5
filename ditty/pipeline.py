"""The Python API: `Pipeline(...).run()` builds a `Trainer.Config` and runs the one `Trainer`.

    from ditty.pipeline import Pipeline, ModelFactory, FSDPConfig

    pipeline = Pipeline(
        model_factory=ModelFactory.from_instance(
            model, fsdp_config=FSDPConfig(enabled=True, transformer_layers=[Block])),
        dataset=dataset, collate_fn=collate, loss_calculator=MSELoss(),
        preprocessors=[NoisePreProcessor()], output_dir="runs/mine", bf16=True, lr=2e-4, epochs=10, grad_accum=4)
    pipeline.run()

There is no second training loop: the keyword arguments become recipe sections (`config()` shows
the Trainer.Config), the Python objects travel beside it as `RuntimeComponents`, and the run
directory is the one a recipe run writes; its recipe.toml lists the objects and says the file
alone cannot re-run it. Everything the recipe compiler checks is checked when `Pipeline(...)` is
constructed (all problems at once, as a RecipeError), including the contract chain
preprocessors -> model -> postprocessors -> loss, so a misfit stops before any training.

The older style still works: subclass `Pipeline` and override `dataset()` to return a DataLoader.
`extra_config` takes `{section: {field: value}}` for any recipe field without a keyword here
(e.g. {"peft": {"kind": "lora", "target_modules": ["fc1"]}} for LoRA on a custom model).

Model tasks (ditty/models/tasks.py): `model_task="seq-classification"` (or "token-classification",
"seq2seq", "masked-lm") with `dataset=` rows of the task's format (dicts such as {"text": ...,
"label": ...}, or a datasets.Dataset) and a `tokenizer=`: ditty checks, labels and tokenizes them
as for a recipe. The model is a `model_factory` (a transformers model of the task), or built from
`extra_config={"model": {"path": ...}}`; data may come from `extra_config={"data": {...}}` instead
of `dataset=`. The tokenizer (given, or found beside a given transformers model) is saved in final/.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import torch

from ditty.config.errors import Problem, RecipeError
from ditty.data.hf import Data
from ditty.train import Trainer
from ditty.train.components import RuntimeComponents

__all__ = ["Data", "FSDPConfig", "ModelFactory", "Pipeline"]


@dataclass(frozen=True)
class FSDPConfig:
    """FSDP2 for a Python API model: which block classes to shard (one FSDP unit each)."""

    enabled: bool = False
    transformer_layers: Sequence[type] = ()
    """Block classes to shard; empty: the model's `_no_split_modules`."""
    reshard_after_forward: bool = True
    cpu_offload: bool = False


class ModelFactory:
    """How the Pipeline gets its model: an instance, or a class loaded from a checkpoint file."""

    def __init__(
        self,
        build: Callable[[], torch.nn.Module],
        *,
        contract: Any = None,
        fsdp_config: Optional[FSDPConfig] = None,
        description: str = "",
    ) -> None:
        self._build = build
        self.contract = contract
        self.fsdp_config = fsdp_config or FSDPConfig()
        self.description = description

    @classmethod
    def from_instance(cls, model: torch.nn.Module, *, fsdp_config: Optional[FSDPConfig] = None) -> "ModelFactory":
        if not isinstance(model, torch.nn.Module):
            raise RecipeError.single(
                f"from_instance takes an nn.Module, not {type(model).__name__}", key="model_factory"
            )
        return cls(
            lambda: model,
            contract=getattr(model, "contract", None),
            fsdp_config=fsdp_config,
            description=type(model).__qualname__,
        )

    @classmethod
    def from_checkpoint(
        cls,
        path: str,
        model_class: type,
        *,
        fsdp_config: Optional[FSDPConfig] = None,
        strict: bool = True,
        **kwargs: Any,
    ) -> "ModelFactory":
        """`model_class(**kwargs)` with weights from `path`: a .safetensors file, a directory holding
        model.safetensors (a run's final/), or a torch file read with `weights_only=True` (never
        unpickling code). A {"model": ...} or {"state_dict": ...} wrapper is unwrapped."""
        if not os.path.exists(path):
            raise RecipeError.single(
                f"checkpoint {path!r} does not exist",
                key="model_factory",
                fix="give the path of a weights file or a run's final/",
            )

        def build() -> torch.nn.Module:
            model = model_class(**kwargs)
            missing, unexpected = model.load_state_dict(load_weights(path), strict=False)
            if strict and (missing or unexpected):
                raise RecipeError.single(
                    f"{path} does not fit {model_class.__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}",
                    key="model_factory",
                    fix="pass the model_class and kwargs the checkpoint was saved from, or strict=False",
                )
            return model

        return cls(
            build,
            contract=getattr(model_class, "contract", None),
            fsdp_config=fsdp_config,
            description=f"{model_class.__qualname__} from {path}",
        )

    def build(self) -> torch.nn.Module:
        model = self._build()
        if not isinstance(model, torch.nn.Module):
            raise RecipeError.single(
                f"the model factory returned {type(model).__name__}, not an nn.Module", key="model_factory"
            )
        return model


def load_weights(path: str) -> dict[str, torch.Tensor]:
    if os.path.isdir(path):
        for name in ("model.safetensors", "pytorch_model.bin", "model.pt"):
            if os.path.exists(os.path.join(path, name)):
                return load_weights(os.path.join(path, name))
        raise RecipeError.single(
            f"{path} holds no model.safetensors, pytorch_model.bin or model.pt", key="model_factory"
        )
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refuses pickled code: say so rather than unpickle it
        raise RecipeError.single(
            f"cannot read {path} as plain weights: {exc}",
            key="model_factory",
            fix="save a state_dict (torch.save(model.state_dict(), ...)) or safetensors",
        ) from None
    for wrapper in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    return state


class Pipeline:
    """Train a model from Python objects through the recipe Trainer (see the module doc)."""

    def __init__(
        self,
        model_factory: Any = None,
        dataset: Any = None,
        *,
        dataloader: Any = None,
        collate_fn: Optional[Callable] = None,
        val_dataset: Any = None,
        loss_calculator: Any = None,
        preprocessors: Optional[list] = None,
        postprocessors: Optional[list] = None,
        output_dir: str = "./output",
        name: str = "pipeline",
        fp16: bool = False,
        bf16: bool = False,
        use_8bit_optim: bool = False,
        optim_backend: str = "torchao",
        lr: float = 2e-4,
        weight_decay: float = 0.0,
        epochs: float = 1,
        steps: Optional[int] = None,
        batch_size: int = 8,
        grad_accum: int = 1,
        max_grad_norm: float = 1.0,
        warmup_steps: int = 0,
        lr_schedule: str = "constant",
        accelerator_kwargs: Optional[dict] = None,
        seed: int = 0,
        device: str = "auto",
        num_threads: int = 0,
        log_every: int = 10,
        eval_every: int = 0,
        checkpoint_every: int = 0,
        check_contracts: bool = True,
        progress: bool = True,
        task: Any = None,
        extra_config: Optional[dict[str, dict]] = None,
        trainer_class: type = Trainer,
        tokenizer: Any = None,
        model_task: Optional[str] = None,
    ) -> None:
        if fp16 and bf16:
            raise RecipeError.single(
                "fp16 and bf16 are both set; pick one compute precision",
                key="Pipeline(fp16, bf16)",
                fix="pass fp16=True or bf16=True, not both",
            )
        if isinstance(model_factory, torch.nn.Module):
            model_factory = ModelFactory.from_instance(model_factory)
        self.model_factory = model_factory
        self._dataset = dataset
        self._dataloader = dataloader
        self.collate_fn = collate_fn
        self.val_dataset = val_dataset
        self.loss_calculator = loss_calculator
        self.preprocessors = list(preprocessors or [])
        self.postprocessors = list(postprocessors or [])
        self.task = task
        self.tokenizer = tokenizer
        self.model_task = model_task
        self.trainer_class = trainer_class
        self.settings = dict(
            output_dir=output_dir,
            name=name,
            fp16=fp16,
            bf16=bf16,
            use_8bit_optim=use_8bit_optim,
            optim_backend=optim_backend,
            lr=lr,
            weight_decay=weight_decay,
            epochs=epochs,
            steps=steps,
            batch_size=batch_size,
            grad_accum=grad_accum,
            max_grad_norm=max_grad_norm,
            warmup_steps=warmup_steps,
            lr_schedule=lr_schedule,
            accelerator_kwargs=dict(accelerator_kwargs or {}),
            seed=seed,
            device=device,
            num_threads=num_threads,
            log_every=log_every,
            eval_every=eval_every,
            checkpoint_every=checkpoint_every,
            check_contracts=check_contracts,
            progress=progress,
            extra_config=dict(extra_config or {}),
        )
        self.trainer: Optional[Trainer] = None
        self.check()

    # ---------------------------------------------------------------- overridable hooks

    def dataset(self) -> Any:
        """The training data: a dataset of samples or a DataLoader. Subclasses may override it
        (the older style) to build and return a DataLoader, e.g. with `Data(...).prepare(...)`."""
        return self._dataloader if self._dataloader is not None else self._dataset

    def model(self) -> torch.nn.Module:
        if self.model_factory is None:
            raise RecipeError.single(
                "Pipeline needs a model_factory (ModelFactory.from_instance(model))", key="model_factory"
            )
        return self.model_factory.build()

    # ---------------------------------------------------------------- config and checks

    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))

    def config(self, data: Any = None) -> Any:
        """The Trainer.Config this pipeline runs (grad_accum: global = micro x grad_accum x data-parallel size)."""
        from ditty.config import sections as S

        s = self.settings
        micro = s["batch_size"]
        if isinstance(data, torch.utils.data.DataLoader) and data.batch_size:
            micro = data.batch_size  # each of the loader's batches is one micro-batch
        precision = "fp16" if s["fp16"] else "bf16" if s["bf16"] else "fp32"
        fp8 = S.Fp8Config()
        accel = dict(s["accelerator_kwargs"])
        mixed = accel.pop("mixed_precision", None)
        if accel:
            raise RecipeError.single(
                f"accelerator_kwargs {sorted(accel)} are not supported (only mixed_precision)",
                key="accelerator_kwargs",
                fix="use the Pipeline keyword or extra_config for that setting",
            )
        if mixed == "fp8":
            fp8 = S.Fp8Config(enabled=True, backend="te")
        elif mixed in ("bf16", "fp16"):
            precision = mixed
        elif mixed not in (None, "no", "fp32"):
            raise RecipeError.single(
                f"accelerator_kwargs mixed_precision {mixed!r} is not one of fp8, bf16, fp16, no",
                key="accelerator_kwargs",
            )
        fsdp = getattr(self.model_factory, "fsdp_config", None) or FSDPConfig()
        parallel = S.ParallelConfig()
        if fsdp.enabled:
            parallel = S.ParallelConfig(
                kind="fsdp",
                block_classes=[c.__name__ for c in fsdp.transformer_layers],
                reshard_after_forward=fsdp.reshard_after_forward,
                cpu_offload=fsdp.cpu_offload,
            )
        elif self.world_size() > 1:
            parallel = S.ParallelConfig(kind="ddp")
        config = Trainer.Config(
            run=S.RunConfig(
                name=s["name"],
                output_dir=s["output_dir"],
                seed=s["seed"],
                device=s["device"],
                num_threads=s["num_threads"],
            ),
            train=S.TrainConfig(
                steps=s["steps"],
                epochs=float(s["epochs"]),
                micro_batch_size=micro,
                global_batch_size=micro * s["grad_accum"] * self.world_size(),
                max_grad_norm=s["max_grad_norm"],
                precision=precision,
                log_every=s["log_every"],
                eval_every=s["eval_every"],
            ),
            optimizer=S.OptimizerConfig(
                kind="adamw8bit" if s["use_8bit_optim"] else "adamw",
                backend=s["optim_backend"] if s["use_8bit_optim"] else "default",
                lr=s["lr"],
                weight_decay=s["weight_decay"],
            ),
            scheduler=S.SchedulerConfig(kind=s["lr_schedule"], warmup_steps=s["warmup_steps"]),
            parallel=parallel,
            fp8=fp8,
            checkpoint=S.CheckpointConfig(every=s["checkpoint_every"]),
            logging=S.LoggingConfig(progress=s["progress"]),
            pipeline=S.PipelineConfig(check_tensors=s["check_contracts"]),
        )
        if self.model_task is not None:  # the task and its own data format; extra_config may refine both
            from ditty.models.tasks import model_task

            task = model_task(self.model_task)
            config = replace(
                config,
                model=replace(config.model, task=task.name),
                data=replace(config.data, format=task.data_formats[0]),
            )
        for section, values in s["extra_config"].items():
            if not hasattr(config, section):
                raise RecipeError.single(f"extra_config: no recipe section [{section}]", key=f"extra_config.{section}")
            try:
                config = replace(config, **{section: replace(getattr(config, section), **values)})
            except TypeError as exc:
                raise RecipeError.single(f"extra_config[{section!r}]: {exc}", key=f"extra_config.{section}") from None
        return config

    def check(self, data: Any = None) -> None:
        """Every compiler rule on the config, the component slots, and the contract chain; raise them all at once."""
        from ditty.recipe import compile_config
        from ditty.recipe.pipeline_rules import check_instances

        problems: list[Problem] = []
        # The Python objects replace [model], [tokenizer] and [data]: their defaults are not the user's.
        plan = compile_config(self.config(data), world_size=self.world_size(), replaced=self.replaced_sections())
        self.plan = plan  # the Trainer runs on this plan instead of compiling again
        problems += plan.errors
        problems += self._slot_problems()
        if not [p for p in problems if p.severity == "error"]:
            model_name = f"model ({getattr(self.model_factory, 'description', '') or 'unknown'})"
            problems += [
                p
                for p in check_instances(
                    self.preprocessors,
                    self.model_factory,
                    self.postprocessors,
                    self.loss_calculator,
                    model_name=model_name,
                )
                if p.severity == "error"
            ]
        if problems:
            raise RecipeError(problems, source="Pipeline(...)")

    def replaced_sections(self) -> tuple[str, ...]:
        """The recipe sections Python objects stand in for: their defaults are nobody's choice, so the
        compiler leaves their problems out. A section given through extra_config is the user's."""
        given = self.settings["extra_config"]
        replaced = []
        if self.model_factory is not None or "model" not in given:
            replaced.append("model.")
        if self.tokenizer is not None or ("tokenizer" not in given and "model" not in given):
            replaced.append("tokenizer.")
        if self._dataset is not None or self._dataloader is not None or "data" not in given:
            replaced.append("data.")
        return tuple(replaced)

    def _slot_problems(self) -> list[Problem]:
        from ditty.loss import LossCalculator
        from ditty.processors import PostProcessor, PreProcessor

        problems = []
        for slot, items, base in (
            ("preprocessors", self.preprocessors, PreProcessor),
            ("postprocessors", self.postprocessors, PostProcessor),
        ):
            for index, item in enumerate(items):
                if not isinstance(item, base):
                    problems.append(
                        Problem(
                            f"{slot}[{index}]",
                            f"{type(item).__name__} is not a {base.__name__}",
                            fix=f"subclass ditty.processors.{base.__name__} and implement process()",
                        )
                    )
        if self.loss_calculator is not None and not isinstance(self.loss_calculator, LossCalculator):
            problems.append(
                Problem(
                    "loss_calculator",
                    f"{type(self.loss_calculator).__name__} is not a LossCalculator",
                    fix="subclass ditty.loss.LossCalculator and implement compute()",
                )
            )
        if self.model_factory is not None and not isinstance(self.model_factory, ModelFactory):
            problems.append(
                Problem(
                    "model_factory",
                    f"{type(self.model_factory).__name__} is not a ModelFactory or nn.Module",
                    fix="ModelFactory.from_instance(model) or ModelFactory.from_checkpoint(path, cls)",
                )
            )
        return problems

    # ---------------------------------------------------------------- running

    def components(self, data: Any) -> RuntimeComponents:
        from ditty.loss import CausalLMLoss

        loader = data if isinstance(data, torch.utils.data.DataLoader) else None
        extra = self.settings["extra_config"]
        causal = (self.model_task or extra.get("model", {}).get("task", "causal-lm")) == "causal-lm"
        # No model_factory: the model is [model] of extra_config (else model() says a factory is needed).
        model = self.model() if self.model_factory is not None or "model" not in extra else None
        return RuntimeComponents(
            model=model,
            dataset=None if loader is not None else data,
            dataloader=loader,
            val_dataset=self.val_dataset,
            collate_fn=self.collate_fn,
            preprocessors=self.preprocessors,
            postprocessors=self.postprocessors,
            # Another model task's loss comes from the task table when none is given.
            loss=self.loss_calculator or (CausalLMLoss() if causal else None),
            task=self.task,
            tokenizer=self.tokenizer,
        )

    def build_trainer(self) -> Trainer:
        data = self.dataset()
        if data is None and "data" not in self.settings["extra_config"]:
            raise RecipeError.single(
                "Pipeline has no data: pass dataset= or dataloader=, or override dataset() (or name the data "
                'with extra_config={"data": {...}})',
                key="dataset",
            )
        config = self.config(data)
        if isinstance(data, torch.utils.data.DataLoader):
            self.check(data)  # the loader's batch size is the micro-batch size
        return self.trainer_class(config, components=self.components(data), plan=self.plan)

    def run(self) -> Any:
        """Train; returns the Trainer's TrainResult (run_dir, final_dir, steps, eval metrics).

        Under torchrun the Trainer joins the process group; when the run ends normally, the group
        is destroyed again if this run created it (one the caller made before stays theirs).
        """
        import contextlib

        import torch.distributed as dist

        from ditty.train.runtime import process_group_for_run

        created_here = not (dist.is_available() and dist.is_initialized())
        with process_group_for_run() if created_here else contextlib.nullcontext():
            self.trainer = self.build_trainer()
            return self.trainer.train()
