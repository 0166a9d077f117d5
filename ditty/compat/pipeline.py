"""The Python API: `Pipeline(...).run()` builds a `Trainer.Config` and runs the one `Trainer`.

    from ditty import Pipeline, ModelFactory, FSDPConfig

    pipeline = Pipeline(
        model_factory=ModelFactory.from_instance(
            model, fsdp_config=FSDPConfig(enabled=True, transformer_layers=[Block])),
        dataset=dataset, collate_fn=collate, loss_calculator=MSELoss(),
        preprocessors=[NoisePreProcessor()], output_dir="runs/mine", bf16=True, lr=2e-4, epochs=10, grad_accum=4)
    print(pipeline)          # the stages, their contracts and what the chain check found
    pipeline.run()

There is no second training loop: the keyword arguments become recipe sections
(ditty.compat.pipeline_options; `config()` shows the Trainer.Config), the Python objects travel beside it
as `RuntimeComponents`, and the run directory is the one a recipe run writes; its recipe.toml lists
the objects and says the file alone cannot re-run it. Everything the recipe compiler checks is
checked when `Pipeline(...)` is constructed (all problems at once, as a RecipeError), including
the contract chain preprocessors -> model -> postprocessors -> loss (each part of a CompositeLoss
too), so a misfit stops before any training; warnings are logged and kept in `warnings`.

Code written for the original Ditty runs as is: its keywords (`use_bfloat16`, `max_steps`,
`tokenizer_factory`, `optimizer`, `metrics_logger`, `push_to_hub`, `hf_hub_token`, ...) are
accepted, and those ditty cannot honour are refused with what to use instead. Defaults are
ditty's own; docs/python-api/coming-from-ditty.md lists where they differ from the original's.

The older style still works: subclass `Pipeline` and override `dataset()` to return a DataLoader.
`extra_config` takes `{section: {field: value}}` for any recipe field without a keyword here
(e.g. {"peft": {"kind": "lora", "target_modules": ["fc1"]}} for LoRA on a custom model).

Model tasks (ditty/models/tasks.py): `model_task="seq-classification"` (or "token-classification",
"seq2seq", "masked-lm") with `dataset=` rows of the task's format (dicts such as {"text": ...,
"label": ...}, or a datasets.Dataset) and a `tokenizer=`: ditty checks, labels and tokenizes them
as for a recipe. The model is a `model_factory` (a transformers model of the task), or built from
`extra_config={"model": {"path": ...}}`; data may come from `extra_config={"data": {...}}` instead
of `dataset=`. The tokenizer (given, or found beside a given transformers model) is saved in final/.

Post-training (ditty.compat.objectives): `preference=PreferenceConfig(...)` trains the DPO family on
preference rows; `reward_fn=` (with `rl=RLConfig(...)`, and `rollout=RolloutConfig(...)` for how it
samples) runs GRPO on prompt rows; `distill=
DistillConfig(teacher=...)` distils a teacher into the model on prompt/completion rows.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Callable, Optional

import torch

from ditty.compat.data import Data
from ditty.compat.model_factory import FSDPConfig, ModelFactory, PeftConfig, QuantConfig, TokenizerFactory, load_weights
from ditty.compat.objectives import (
    objective_loss,
    objective_row,
    reward_function_list,
    reward_function_problems,
    with_current_keys,
    with_objective,
    with_text_row_format,
)
from ditty.compat.pipeline_options import build_config, keyword_problems, slot_problems, unknown_keyword_problems
from ditty.config.errors import Problem, RecipeError
from ditty.objectives.preference_loss import PreferenceLoss
from ditty.train import Trainer
from ditty.train.components import RuntimeComponents

__all__ = ["Data", "FSDPConfig", "ModelFactory", "PeftConfig", "Pipeline", "QuantConfig", "TokenizerFactory"]
__all__ += ["load_weights"]

log = logging.getLogger("ditty.pipeline")

OBJECT_KEYWORDS = frozenset(
    {"model_factory", "dataset", "collate_fn", "tokenizer_factory", "loss_calculator", "preprocessors"}
    | {"postprocessors", "dataloader", "val_dataset", "metrics_logger", "task", "trainer_class", "tokenizer"}
    | {"model_task", "preference", "rl", "reward_fn", "distill"}
)
"""The keywords that are Python objects (or choose them), kept as attributes; the rest are settings."""


class Pipeline:
    """Train a model from Python objects through the recipe Trainer (see the module doc)."""

    def __init__(
        self,
        model_factory: Any = None,
        dataset: Any = None,
        collate_fn: Optional[Callable] = None,
        tokenizer_factory: Any = None,
        loss_calculator: Any = None,
        preprocessors: Optional[list] = None,
        postprocessors: Optional[list] = None,
        output_dir: str = "./output",
        *,
        dataloader: Any = None,
        val_dataset: Any = None,
        name: str = "pipeline",
        fp16: bool = False,
        bf16: bool = False,
        use_bfloat16: bool = False,
        use_8bit_optim: bool = False,
        optim_backend: str = "torchao",
        muon_lr: Optional[float] = None,
        muon_weight_decay: Optional[float] = None,
        muon_momentum: float = 0.95,
        muon_nesterov: bool = True,
        muon_ns_steps: int = 5,
        muon_adjust_lr_fn: Optional[str] = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
        lr: float = 2e-4,
        scale_lr_by_world_size: bool = False,
        weight_decay: float = 0.0,
        epochs: float = 1,
        steps: Optional[int] = None,
        max_steps: Optional[int] = None,
        batch_size: int = 8,
        grad_accum: int = 1,
        max_grad_norm: float = 1.0,
        warmup_steps: int = 0,
        lr_schedule: str = "constant",
        gradient_checkpointing: bool = False,
        accelerator_kwargs: Optional[dict] = None,
        accelerator_mixed_precision: Optional[str] = None,
        seed: Optional[int] = 0,
        device: str = "auto",
        num_threads: int = 0,
        log_every: int = 10,
        eval_every: int = 0,
        validation_every: Optional[int] = None,
        checkpoint_every: int = 0,
        load_checkpoint: bool = True,
        save_final_checkpoint: bool = True,
        load_optimizer_checkpoint: bool = True,
        metrics_logger: Any = None,
        push_to_hub: bool = False,
        output_hub_repo: Optional[str] = None,
        hf_hub_token: Optional[str] = None,
        private_repo: bool = True,
        merge_adapters: bool = False,
        shuffle_each_epoch: bool = True,
        num_workers: Optional[int] = None,
        shuffle_buffer_size: Optional[int] = None,
        check_contracts: bool = True,
        progress: bool = True,
        task: Any = None,
        extra_config: Optional[dict[str, dict]] = None,
        trainer_class: type = Trainer,
        tokenizer: Any = None,
        model_task: Optional[str] = None,
        preference: Any = None,
        rl: Any = None,
        reward_fn: Any = None,
        distill: Any = None,
        rollout: Any = None,
        **unknown: Any,
    ) -> None:
        output_dir = os.fspath(output_dir) if isinstance(output_dir, os.PathLike) else output_dir
        given = {name: value for name, value in locals().items() if name not in ("self", "unknown")}
        if unknown:
            known = [p for p in inspect.signature(Pipeline.__init__).parameters if p not in ("self", "unknown")]
            raise RecipeError(unknown_keyword_problems(unknown, known), source="Pipeline(...)")
        if fp16 and bf16:
            raise RecipeError.single(
                "fp16 and bf16 are both set; pick one compute precision",
                key="Pipeline(fp16, bf16)",
                fix="pass fp16=True or bf16=True, not both",
            )
        for keyword, stages in (("preprocessors", preprocessors), ("postprocessors", postprocessors)):
            if stages is not None and not isinstance(stages, (list, tuple)):
                raise RecipeError.single(
                    f"takes a list of stages, got {type(stages).__name__}",
                    key=keyword,
                    fix=f"wrap it in a list: {keyword}=[...]",
                    source="Pipeline(...)",
                )
        if isinstance(model_factory, torch.nn.Module):
            model_factory = ModelFactory.from_instance(model_factory)
        self.model_factory = model_factory
        self.tokenizer_factory = tokenizer_factory
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
        # Post-training objectives (ditty.compat.objectives): the DPO family, GRPO with reward functions,
        # or on-policy distillation.
        if preference is None and isinstance(loss_calculator, PreferenceLoss):
            preference = loss_calculator.config  # a PreferenceLoss given alone reads preference rows
        self.preference, self.rl, self.distill, self.rollout = preference, rl, distill, rollout
        self.reward_functions = reward_function_list(reward_fn)
        self.trainer_class = trainer_class
        self.metrics_logger = metrics_logger
        self._hf_hub_token = hf_hub_token  # memory only: not in settings, recipe.toml, env.json or logs
        # Every keyword that is not a Python object becomes a setting (ditty.compat.pipeline_options);
        # the token stays in memory only: settings hold whether there is one.
        self.settings = {name: given[name] for name in given if name not in OBJECT_KEYWORDS}
        self.settings.update(
            accelerator_kwargs=dict(accelerator_kwargs or {}),
            hf_hub_token=bool(hf_hub_token),
            extra_config=with_current_keys(extra_config),
        )
        self.trainer: Optional[Trainer] = None
        self.model: Optional[torch.nn.Module] = None
        """The trained model, after `run()` (as in the original Ditty)."""
        self.warnings: list[Problem] = []
        self.check()

    # ---------------------------------------------------------------- overridable hooks

    def dataset(self) -> Any:
        """The training data: a dataset of samples or a DataLoader. Subclasses may override it
        (the older style) to build and return a DataLoader, e.g. with `Data(...).prepare(...)`."""
        return self._dataloader if self._dataloader is not None else self._dataset

    def build_model(self) -> Optional[torch.nn.Module]:
        """The model instance, or None when the Trainer loads it (a Hugging Face model by path)."""
        if self.model_factory is None:
            raise RecipeError.single(
                "Pipeline needs a model_factory (ModelFactory.from_instance(model))", key="model_factory"
            )
        # The base model: the Trainer applies the factory's transform and adapter (ModelFactory.build()
        # applies them itself, for code that wants the model without a run).
        factory = self.model_factory
        return None if getattr(factory, "hub_path", None) is not None else factory.base_model()

    # ---------------------------------------------------------------- config and checks

    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))

    def config(self, data: Any = None) -> Any:
        """The Trainer.Config this pipeline runs (grad_accum: global = micro x grad_accum x data-parallel size).
        `data` defaults to the dataset or DataLoader given (not an overridden dataset(), built at run time)."""
        if data is None:
            data = self._dataloader if self._dataloader is not None else self._dataset
        config = build_config(self.settings, self.model_factory, data, self.world_size(), model_task=self.model_task)
        first_row = data[0] if isinstance(data, (list, tuple)) and data else None  # online pairs: prompts or pairs
        keywords = (self.preference, self.rl, self.reward_functions, self.loss_calculator)
        config = with_objective(config, *keywords, distill=self.distill, first_row=first_row, rollout=self.rollout)
        return with_text_row_format(config, data, self.preprocessors, self.tokenizer or self.tokenizer_factory)

    def check(self, data: Any = None) -> None:
        """Every compiler rule on the config, the keywords, the component slots, and the contract
        chain; raise the errors all at once, log the warnings (kept in `self.warnings`). The plan is
        kept for the Trainer, which runs on it instead of compiling again."""
        from ditty.contracts.errors import ContractChainError
        from ditty.recipe import compile_config
        from ditty.recipe.pipeline_rules import check_instances

        peek = data if data is not None else self._dataloader if self._dataloader is not None else self._dataset
        problems = slot_problems(self) + keyword_problems(self.settings, peek, self.model_factory, self.val_dataset)
        if not [p for p in problems if p.severity == "error"]:
            replaced = self.replaced_sections()
            config = self.config(data)
            self.plan = compile_config(config, world_size=self.world_size(), replaced=replaced)
            problems += self.plan.problems + reward_function_problems(self.reward_functions, config)
        if not [p for p in problems if p.severity == "error"]:
            problems += check_instances(
                self.preprocessors,
                self.model_factory,
                self.postprocessors,
                self.loss_calculator,
                model_name=self._model_name(),
                batch_spec=self.batch_spec(),
            )
        errors = [p for p in problems if p.severity == "error"]
        if errors:
            contract_only = all(p.rule.startswith("contract.") for p in errors)
            raise (ContractChainError if contract_only else RecipeError)(errors, source="Pipeline(...)")
        self.warnings = [p for p in problems if p.severity == "warning" and p.rule != "contract.unchecked"]
        for problem in self.warnings:
            log.warning("Pipeline(...): %s", problem.format())

    def batch_spec(self) -> Optional[str]:
        """What a batch of the given dataset is, for the contract chain: the keys of a dict batch, or
        one tensor; None (unknown) for a DataLoader, an overridden dataset(), or anything else.
        Found by collating the first sample (a dict batch lets a loss read its columns from the context)."""
        if self._dataset is None or type(self).dataset is not Pipeline.dataset:
            return None
        try:
            sample = self._dataset[0]
            batch = (self.collate_fn or torch.utils.data.default_collate)([sample])
        except Exception:  # noqa: BLE001 - a peek only: an odd dataset is checked when it runs
            return None
        if isinstance(batch, dict):
            return ", ".join(str(k) for k in batch) or None
        return "batch" if torch.is_tensor(batch) else None

    def describe(self) -> str:
        """The stages with their contracts and whether each was checked (what `print(pipeline)` shows)."""
        from ditty.recipe.chain_report import describe_chain

        factory = self.model_factory
        title = f"Pipeline -> {self.settings['output_dir']}: model {getattr(factory, 'description', '?')}"
        text = describe_chain(
            self.preprocessors,
            factory,
            self.postprocessors,
            self.loss_calculator,
            model_name=self._model_name(),
            batch_spec=self.batch_spec(),
            title=title,
            default_loss=self._default_loss(),
        )
        return text

    def _default_loss(self) -> str:
        """What trains when no loss_calculator is given: the objective's own loss, else the task's."""
        try:
            config = self.config()
        except Exception:  # noqa: BLE001 - a description only: check() and run() report what is wrong
            chosen = (self.preference, self.rl, self.reward_functions, self.distill)
            if any(keyword is not None for keyword in chosen):
                return "the objective's own; pipeline.check() says what the settings still miss"
            return "the default CausalLMLoss"
        return objective_loss(config)

    def __str__(self) -> str:
        return self.describe()

    def _model_name(self) -> str:
        return f"model ({getattr(self.model_factory, 'description', '') or 'unknown'})"

    def replaced_sections(self) -> tuple[str, ...]:
        """The recipe sections Python objects stand in for: their defaults are nobody's choice, so the
        compiler leaves their problems out. A section given through extra_config (or a hub model's
        path) is the user's."""
        given = self.settings["extra_config"]
        factory = self.model_factory
        replaced = []
        if (factory is not None and getattr(factory, "hub_path", None) is None) or (
            factory is None and "model" not in given
        ):
            replaced.append("model.")
        given_tokenizer = self.tokenizer is not None or self.tokenizer_factory is not None
        if given_tokenizer or ("tokenizer" not in given and "model" not in given):
            replaced.append("tokenizer.")
        if self._dataset is not None or self._dataloader is not None or "data" not in given:
            replaced.append("data.")
        if self.reward_functions:
            # The functions stand in for rl.rewards; their weights are checked against them (check()).
            replaced += ["rl.rewards", "rl.reward_weights"]
        return tuple(replaced)

    # ---------------------------------------------------------------- running

    def components(self, data: Any, config: Any) -> RuntimeComponents:
        """The Python objects of the run; `config` is `self.config(data)`, which chose the objective."""
        from ditty.stages.loss import CausalLMLoss

        loader = data if isinstance(data, torch.utils.data.DataLoader) else None
        extra = self.settings["extra_config"]
        causal = (self.model_task or extra.get("model", {}).get("task", "causal-lm")) == "causal-lm"
        # No model_factory: the model is [model] of extra_config (else build_model() says a factory is needed).
        model = self.build_model() if self.model_factory is not None or "model" not in extra else None
        if self.tokenizer is not None:
            tokenizer = self.tokenizer
        else:
            tokenizer = self.tokenizer_factory.build() if self.tokenizer_factory is not None else None
        return RuntimeComponents(
            model=model,
            dataset=None if loader is not None else data,
            dataloader=loader,
            val_dataset=self.val_dataset,
            collate_fn=self.collate_fn,
            preprocessors=self.preprocessors,
            postprocessors=self.postprocessors,
            # Another model task's loss comes from the task table when none is given.
            # An objective's loss (preference, GRPO) is the Trainer's, built from its section.
            loss=self.loss_calculator or (CausalLMLoss() if causal and not objective_row(config) else None),
            task=self.task,
            tokenizer=tokenizer,
            optimizer=self.settings["optimizer"],
            metrics_logger=self.metrics_logger,
            converters=self.model_factory.converters() if self.model_factory is not None else None,
            hub_token=self._hf_hub_token,
            reward_functions=self.reward_functions,
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
        if isinstance(data, torch.utils.data.DataLoader) or type(self).dataset is not Pipeline.dataset:
            self.check(data)  # a loader's batch size is the micro-batch size; an overridden dataset() is new data
        return self.trainer_class(config, components=self.components(data, config), plan=self.plan)

    def run(self) -> Any:
        """Train; returns the Trainer's TrainResult (run_dir, final_dir, steps, eval metrics). The
        trained model is `self.model` afterwards.

        Under torchrun the Trainer joins the process group; when the run ends normally, the group
        is destroyed again if this run created it (one the caller made before stays theirs).
        """
        import contextlib

        import torch.distributed as dist

        from ditty._utils.modules import unwrap as unwrap_model
        from ditty._utils.quiet import known_warnings_ignored
        from ditty.models.quiet_io import model_bars_quiet
        from ditty.parallel.runtime import process_group_for_run

        created_here = not (dist.is_available() and dist.is_initialized())
        group = process_group_for_run() if created_here else contextlib.nullcontext()
        with group, known_warnings_ignored(), model_bars_quiet():  # the libraries' noise, unless verbose
            self.trainer = self.build_trainer()
            result = self.trainer.train()
            if getattr(self.trainer, "model", None) is not None:
                self.model = unwrap_model(self.trainer.model)
            return result
