"""The original Ditty's public names, each used as its README or docstrings use it: what works, and
what is refused with a RecipeError that says what to use instead (never a TypeError)."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from ditty import (
    CompositeLoss,
    ContractViolation,
    FSDPConfig,
    MetricsLogger,
    ModelFactory,
    ModelTransform,
    MSELoss,
    PeftConfig,
    Pipeline,
    QuantConfig,
    RecipeError,
    TokenizerFactory,
    TrainerState,
    UncertaintyWeightedLoss,
    print_pipeline,
)
from ditty.processors import PostProcessor, PreProcessor
from examples.custom_pipeline import Regressor, SplitTarget, make_rows


def pipeline(tmp_path, **kwargs) -> Pipeline:
    args = dict(
        model_factory=ModelFactory.from_instance(Regressor()),
        dataset=make_rows(64),
        loss_calculator=MSELoss(contract="y:2:f32, ctx.target:2:f32 -> loss:0:f32"),
        preprocessors=[SplitTarget()],
        output_dir=str(tmp_path / "run"),
    )
    return Pipeline(**{**args, **kwargs})


# --- Pipeline keywords -------------------------------------------------------------------------


def test_the_original_pipeline_keywords_map_onto_recipe_sections(tmp_path):
    c = pipeline(
        tmp_path,
        use_bfloat16=True,
        max_steps=5,
        epochs=2,
        batch_size=4,
        load_checkpoint=False,
        gradient_checkpointing=True,
        push_to_hub=True,
        output_hub_repo="me/model",
        hf_hub_token="hf_NotWrittenAnywhere",
        private_repo=False,
        merge_adapters=True,
        shuffle_each_epoch=True,
        validation_every=3,
        seed=None,
        accelerator_mixed_precision="bf16",
    ).config()
    assert (c.train.precision, c.train.steps, c.train.micro_batch_size, c.train.eval_every) == ("bf16", 5, 4, 3)
    assert (c.checkpoint.resume, c.checkpoint.final_format, c.train.activation_checkpointing) == (
        "never",
        "merged",
        "full",
    )
    assert (c.hub.push, c.hub.repo_id, c.hub.private, c.run.seed) == ("end", "me/model", False, 0)
    assert "hf_NotWrittenAnywhere" not in repr(c)
    # max_steps stops at the end of `epochs` when that comes first, as the original's loop did.
    assert pipeline(tmp_path, max_steps=500, epochs=1, batch_size=8).config().train.steps == 8


def test_lr_scales_with_the_world_size_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert pipeline(tmp_path, lr=1e-4).config().optimizer.lr == 1e-4  # ditty's default: no scaling
    c = pipeline(tmp_path, lr=1e-4, scale_lr_by_world_size=True).config()
    assert c.optimizer.lr == 2e-4 and c.parallel.kind == "ddp"


@pytest.mark.parametrize(
    ("kwargs", "message", "fix"),
    [
        ({"optim_backend": "muon", "muon_nesterov": False}, "always uses Nesterov", "muon_nesterov=True"),
        ({"validation_callbacks": [print]}, "original Ditty", "task="),
        ({"batchsize": 4}, "not a Pipeline keyword", "did you mean batch_size?"),
        ({"optim_backend": "adamw_fp8"}, "not built in", "optimizer="),
        ({"save_final_checkpoint": False}, "always saves the last step", "keep_last"),
        ({"load_optimizer_checkpoint": False}, "restores the optimizer", "from_checkpoint"),
        ({"shuffle_each_epoch": False}, "not supported yet", "shuffle=False"),
        ({"num_workers": -1}, "must not be negative", "0 loads"),
        ({"push_to_hub": True}, "needs output_hub_repo", "output_hub_repo="),
    ],
)
def test_keywords_ditty_cannot_honour_are_refused_with_what_to_use(tmp_path, kwargs, message, fix):
    with pytest.raises(RecipeError) as caught:
        pipeline(tmp_path, **kwargs)
    assert message in str(caught.value) and fix in str(caught.value)


def test_optim_backend_muon_and_its_keywords_map_onto_the_optimizer_section(tmp_path):
    c = pipeline(
        tmp_path,
        optim_backend="muon",
        lr=1e-3,
        muon_lr=0.05,
        muon_weight_decay=0.01,
        muon_momentum=0.9,
        muon_ns_steps=3,
        muon_adjust_lr_fn="match_rms_adamw",
    ).config()
    o = c.optimizer
    assert (o.kind, o.lr, o.muon_lr, o.muon_weight_decay, o.muon_momentum) == ("muon", 1e-3, 0.05, 0.01, 0.9)
    assert (o.ns_steps, o.adjust_lr_fn) == (3, "match_rms_adamw")
    assert pipeline(tmp_path, optim_backend="adafactor").config().optimizer.kind == "adafactor"
    p = pipeline(tmp_path, muon_lr=0.05)  # without optim_backend="muon": said, not silently dropped
    assert [w.key for w in p.warnings] == ["muon_lr"] and p.config().optimizer.kind == "adamw"


def test_keywords_without_effect_are_warnings(tmp_path, caplog):
    loader = torch.utils.data.DataLoader(make_rows(16), batch_size=8)
    with caplog.at_level(logging.WARNING, logger="ditty.pipeline"):
        p = pipeline(tmp_path, dataset=loader, num_workers=4, shuffle_buffer_size=1000, hf_hub_token="hf_x")
    assert [w.key for w in p.warnings] == ["hf_hub_token", "shuffle_buffer_size", "num_workers"]
    assert "has no effect" in caplog.text and "hf_x" not in caplog.text


class Stream(torch.utils.data.IterableDataset):
    """A streaming dataset: rows come only by iterating, and the same rows each time."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        return iter(make_rows(self.count))


def test_an_iterable_dataset_needs_max_steps(tmp_path):
    with pytest.raises(RecipeError) as caught:
        pipeline(tmp_path, dataset=Stream(8))
    assert "has no length" in str(caught.value) and "max_steps=" in str(caught.value)
    with pytest.raises(RecipeError, match="iterable validation set"):
        pipeline(tmp_path, dataset=Stream(8), max_steps=2, val_dataset=Stream(4))


def test_a_dataloader_over_an_iterable_dataset_trains_with_max_steps(tmp_path):
    loader = torch.utils.data.DataLoader(Stream(12), batch_size=8)  # 2 batches a pass: step 3 reads it again
    p = pipeline(tmp_path, dataset=loader, max_steps=3, log_every=1, progress=False)
    p.run()
    assert len(_losses(tmp_path / "run")) == 3
    with pytest.raises(RecipeError, match="max_steps="):
        pipeline(tmp_path / "again", dataset=loader)


@pytest.mark.slow
def test_an_iterable_dataset_trains_through_epochs_and_resumes_bitwise(tmp_path):
    """40 rows, 8 a step: step 6 starts the second pass. A run stopped at step 3 and resumed (the
    stream is read again and the 24 trained rows dropped) logs the uninterrupted run's losses."""
    common = dict(batch_size=8, log_every=1, lr_schedule="constant", warmup_steps=0, progress=False)

    def run(folder: str, steps: int, buffer: int) -> list[float]:
        torch.manual_seed(0)
        p = pipeline(
            tmp_path / folder,
            model_factory=ModelFactory.from_instance(Regressor()),
            dataset=Stream(40),
            shuffle_buffer_size=buffer,
            max_steps=steps,
            **common,
        )
        assert p.config().data.shuffle_buffer_size == buffer
        p.run()
        return _losses(tmp_path / folder / "run")

    plain = run("plain", 8, 16)
    assert len(plain) == 8 and all(math.isfinite(loss) for loss in plain)
    run("resumed", 3, 16)
    assert run("resumed", 8, 16) == plain
    assert run("in-order", 8, 1) != plain  # the buffer does shuffle


# --- FSDPConfig, QuantConfig, PeftConfig, ModelFactory ------------------------------------------


def test_fsdp_config_takes_dtypes_and_dicts(tmp_path):
    class Block(torch.nn.Module):
        pass

    fsdp = FSDPConfig(
        enabled=True,
        transformer_layers=[Block],
        param_dtype=torch.bfloat16,
        reduce_dtype=torch.float32,
        reshard_after_forward=False,
    )
    for config in (fsdp, {"enabled": True, "transformer_layers": [Block], "param_dtype": "bf16"}):
        p = ModelFactory.from_instance(Regressor(), fsdp_config=config).recipe_overrides()["parallel"]
        assert (p["kind"], p["block_classes"], p["param_dtype"]) == ("fsdp", ["Block"], "bfloat16")
    assert (p["reduce_dtype"], fsdp.parallel_fields()["reduce_dtype"]) == (None, "float32")
    assert fsdp.parallel_fields()["reshard_after_forward"] is False
    with pytest.raises(RecipeError, match="did you mean 'param_dtype'"):
        ModelFactory.from_instance(Regressor(), fsdp_config={"enabled": True, "param_dtyp": torch.bfloat16})
    with pytest.raises(RecipeError, match="not a dtype ditty trains in"):
        FSDPConfig(enabled=True, param_dtype=torch.int8).parallel_fields()


def test_from_huggingface_loads_through_the_recipe(tmp_path, tiny_llama_dir):
    factory = ModelFactory.from_huggingface(
        tiny_llama_dir,
        quant_config=QuantConfig(enabled=True, bits=4, compute_dtype=torch.bfloat16, quant_storage=torch.bfloat16),
        peft_config={"enabled": True, "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
        load_kwargs={"torch_dtype": torch.float32, "attn_implementation": "sdpa"},
    )
    sections = factory.recipe_overrides()
    assert sections["model"] == {"path": tiny_llama_dir, "dtype": "float32", "attn_implementation": "sdpa"}
    assert sections["quant"] == {
        "kind": "bnb-4bit",
        "quant_type": "nf4",
        "double_quant": True,
        "compute_dtype": "bfloat16",
        "storage_dtype": "bfloat16",
    }
    assert sections["peft"] == {
        "kind": "lora",
        "r": 8,
        "alpha": 16.0,
        "dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
    }
    assert QuantConfig(enabled=True, use_dora=True).quant_fields()["kind"] == "bnb-4bit"
    dora = ModelFactory.from_huggingface(
        tiny_llama_dir, quant_config={"enabled": True, "use_dora": True}, peft_config=PeftConfig(enabled=True)
    )
    assert dora.recipe_overrides()["peft"]["kind"] == "dora"
    with pytest.raises(RecipeError, match="load_kwargs 'device_map' is not supported"):
        ModelFactory.from_huggingface(tiny_llama_dir, device_map="auto").recipe_overrides()
    with pytest.raises(RecipeError, match="Hugging Face models loaded by path"):
        ModelFactory(model=Regressor(), quant_config={"enabled": True}).recipe_overrides()
    with pytest.raises(RecipeError, match="loaded when it is built or run"):
        factory.base_model()  # build() loads it (tests/compat/test_coming_from_ditty.py)


def test_from_checkpoint_and_the_constructor(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(1)
    trained = Regressor(hidden=16)
    torch.save({"model_state_dict": trained.state_dict()}, tmp_path / "w.pt")
    save_file({**trained.state_dict(), "ditty_loss.log_vars": torch.ones(2)}, str(tmp_path / "w.safetensors"))
    for path in ("w.pt", "w.safetensors"):
        factory = ModelFactory.from_checkpoint(str(tmp_path / path), Regressor, use_compile=True, hidden=16)
        assert torch.equal(factory.build().fc1.weight, trained.fc1.weight)
        assert factory.contract == Regressor.contract and factory.recipe_overrides()["train"]["compile"] is True
    fresh = ModelFactory(model_class=Regressor, load_kwargs={"hidden": 8}, contract="x:2:f32 -> y:2:f32")
    assert fresh.build().fc1.out_features == 8
    with pytest.raises(RecipeError, match="needs a model, a model_path, or a model_class"):
        ModelFactory()
    with pytest.raises(RecipeError, match="does not exist"):
        ModelFactory.from_checkpoint(str(tmp_path / "missing.pt"), Regressor)
    compiled = ModelFactory.from_instance(Regressor(), use_compile=True, compile_mode="max-autotune")
    assert compiled.recipe_overrides()["train"] == {
        "compile": True,
        "compile_scope": "model",
        "compile_mode": "max-autotune",
    }


def test_a_model_transform_runs_as_a_converter_before_the_adapter(tmp_path):
    class FreezeFirst(ModelTransform):
        def transform(self, model):
            model.fc1.requires_grad_(False)
            return model

    checkpoint = tmp_path / "w.pt"
    torch.save(Regressor().state_dict(), checkpoint)
    loaded = ModelFactory.from_checkpoint(str(checkpoint), Regressor, model_transform=FreezeFirst(), use_compile=False)
    assert isinstance(loaded.converters()[0], FreezeFirst) and "train" not in loaded.recipe_overrides()
    factory = ModelFactory(model=Regressor(), model_transform=FreezeFirst())
    built = factory.build()  # the transform on a copy: the given model stays as it was, for the Pipeline
    assert not built.fc1.weight.requires_grad and factory.base_model().fc1.weight.requires_grad
    p = pipeline(tmp_path, model_factory=factory, steps=1, device="cpu", progress=False)
    trainer = p.build_trainer()
    assert trainer.converters[0] is factory.model_transform
    assert not trainer.model.fc1.weight.requires_grad and trainer.model.fc2.weight.requires_grad
    assert {id(q) for g in trainer.optimizer.param_groups for q in g["params"]} == {
        id(q) for q in trainer.model.parameters() if q.requires_grad
    }


def test_a_users_own_optimizer_is_used_and_checked(tmp_path):
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.fc1.weight.detach().clone()
    p = pipeline(tmp_path, model_factory=model, optimizer=optimizer, steps=2, device="cpu", progress=False)
    p.run()
    assert p.trainer.optimizer is optimizer and not torch.equal(before, model.fc1.weight)
    # LoRA adapters are made after the optimizer: it cannot hold them.
    lora = ModelFactory(model=Regressor(), peft_config={"enabled": True, "target_modules": ["fc1"]})
    late = torch.optim.SGD(lora.build().parameters(), lr=0.1)
    with pytest.raises(RecipeError, match="does not hold 2 of the model's 2 trainable parameters"):
        pipeline(tmp_path / "b", model_factory=lora, optimizer=late, steps=1, device="cpu").build_trainer()
    with pytest.raises(RecipeError, match="cannot hold FSDP's sharded parameters"):
        pipeline(tmp_path, model_factory=ModelFactory.from_instance(model, {"enabled": True}), optimizer=optimizer)


# --- print(pipeline), print_pipeline ------------------------------------------------------------


def test_print_pipeline_shows_every_stage_its_contract_and_whether_it_was_checked(tmp_path, capsys):
    class Undeclared(PostProcessor):
        def process(self, model_output, ctx):
            return model_output, ctx

    p = pipeline(tmp_path, postprocessors=[Undeclared(contract="")])
    print_pipeline(p)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Pipeline -> ") and "model Regressor" in lines[0]
    assert lines[1].split() == [
        "preprocessors[0]",
        "(SplitTarget)",
        "rows:2:f32",
        "->",
        "x:2:f32",
        "|",
        "ctx.target:2:f32",
        "checked",
    ]
    assert lines[2].split()[-1] == "checked" and "x:2:f32 -> y:2:f32" in lines[2]
    assert lines[3].split() == ["postprocessors[0]", "(Undeclared)", "(no", "contract)", "unchecked"]
    assert lines[-1] == "contracts: 3 of 4 stages checked; the chain fits"
    assert str(p) == p.describe() == "\n".join(lines)
    # The original's signature: the parts themselves, and the model's contract.
    print_pipeline(Regressor(), [SplitTarget(rank=3)], [], MSELoss(), model_contract="x:2:f32 -> y:2:f32")
    out = capsys.readouterr().out
    assert "model Regressor: 193 parameters, 193 trainable" in out and "1 problem(s) in the chain" in out
    assert "error: expects `x` with rank 2" in out


def test_a_read_an_undeclared_stage_may_provide_is_a_warning(tmp_path):
    class Undeclared(PreProcessor):
        def process(self, batch, ctx):
            ctx["target"] = batch[:, 4:]
            return batch[:, :4], ctx

    p = pipeline(tmp_path, preprocessors=[Undeclared()])
    assert [(w.key, w.rule) for w in p.warnings] == [("loss (MSELoss)", "contract.ctx-missing")]
    assert "`preprocessors[0] (Undeclared)` (no contract) adds it" in p.warnings[0].message
    with pytest.raises(RecipeError, match="reads ctx.target2 before any stage provides it"):  # all declared: refused
        pipeline(tmp_path, preprocessors=[SplitTarget()], loss_calculator=MSELoss(contract="y, ctx.target2 -> l"))


# --- losses --------------------------------------------------------------------------------------


def test_uncertainty_weighted_loss_learns_one_weight_per_loss():
    loss = UncertaintyWeightedLoss([MSELoss(), MSELoss(target_key="other")])
    prediction = torch.zeros(4, 2)
    ctx = {"target": torch.ones(4, 2), "other": torch.full((4, 2), 3.0)}
    out = loss.compute(prediction, ctx)
    assert out.loss.item() == pytest.approx(0.5 * 1.0 + 0.5 * 9.0)  # s = 0: 0.5 exp(0) L + 0.5 * 0
    out.loss.backward()
    assert loss.log_vars.grad.tolist() == pytest.approx([0.0, -4.0])  # d/ds = -0.5 exp(-s) L + 0.5
    assert out.metrics["mse_0/weight"] == 1.0 and [n for n, _ in loss.named_parameters()] == ["log_vars"]
    with pytest.raises(RecipeError, match="pass the losses alone"):
        UncertaintyWeightedLoss([(MSELoss(), 1.0)])
    with pytest.raises(RecipeError, match="not supported with parallel.kind = 'fsdp'"):
        MSELoss(fsdp=True)


def test_a_loss_with_parameters_joins_the_model_and_the_optimizer():
    from ditty.stages.loss_parameters import attach_loss_parameters, loss_parameters

    class Projected(MSELoss):  # a ported loss holding a layer (the original's losses were nn.Modules)
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(2, 2)

    composite = CompositeLoss([(Projected(), 1.0), (UncertaintyWeightedLoss([MSELoss()]), 0.5)])
    assert [n for n, _ in loss_parameters(composite)] == [
        "parts.0.head.weight",
        "parts.0.head.bias",
        "parts.1.log_vars",
    ]
    model = attach_loss_parameters(Regressor(), composite)
    assert {n for n, _ in model.named_parameters()} >= {"ditty_loss.parts_1_log_vars", "ditty_loss.parts_0_head_weight"}
    assert model.ditty_loss.parts_1_log_vars is composite.parts[1][0].log_vars
    with pytest.raises(RecipeError, match="parallel.kind = 'hsdp'"):
        attach_loss_parameters(Regressor(), composite, parallel_kind="hsdp")


def test_composite_loss_parts_are_checked_on_real_tensors():
    from ditty.train.pipeline import ContractCheck

    loss = CompositeLoss(
        losses=[
            (MSELoss(contract="y:2:f32, ctx.target:2:f32 -> loss:0:f32"), 1.0),
            (MSELoss(output_index=1, contract="z:3:f | ctx.target -> loss:0:f"), 0.5),
        ]
    )
    check = ContractCheck()
    check.loss(loss, (torch.zeros(4, 1), torch.zeros(4, 2)), {"batch": {"target": torch.zeros(4, 1)}})
    assert [(p.key, p.message) for p in check.problems] == [
        (
            "pipeline.loss (CompositeLoss) part 1 (MSELoss)",
            "input `z`: rank 3 declared, but the tensor has shape (4, 2)",
        )
    ]
    with pytest.raises(ContractViolation):
        check.raise_errors()


# --- TokenizerFactory, MetricsLogger, TrainerState, diffusion ------------------------------------


def test_tokenizer_factory_builds_and_keeps_the_token_to_itself(tiny_llama_dir):
    factory = TokenizerFactory(tiny_llama_dir, token="hf_SecretTokenValue")
    tokenizer = factory.build()
    assert tokenizer.pad_token_id is not None and "hf_SecretTokenValue" not in repr(factory)
    assert TokenizerFactory.from_pretrained(tiny_llama_dir).build().vocab_size == tokenizer.vocab_size
    with pytest.raises(RecipeError, match="cannot load the tokenizer"):
        TokenizerFactory("/nonexistent/tokenizer").build()


def test_metrics_logger_writes_tensorboard_at_first_use(tmp_path):
    logger = MetricsLogger(str(tmp_path / "out"), use_tensorboard=True, log_gradients=True, gradient_components=["fc1"])
    assert not (tmp_path / "out").exists()  # nothing written before the run starts
    model = Regressor()
    model(torch.randn(2, 4)).sum().backward()
    logger.log_metrics({"loss": 1.5}, step=1)
    logger.log_gradients(model, step=1)
    logger.log_text("note", "hello", step=1)
    logger.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "out" / "logs"))
    events.Reload()
    assert "train/loss" in events.Tags()["scalars"] and "grads/fc1/weight" in events.Tags()["histograms"]


def test_trainer_state_round_trips():
    state = TrainerState(epoch=2, steps=30, total_steps=130, global_loss=4.5)
    fresh = TrainerState()
    fresh.load_state_dict(state.state_dict())
    assert fresh == state


def test_diffusion_scheduler_the_original_way():
    from ditty.diffusion import Scheduler

    readme = Scheduler(max_timesteps=1000, schedule_type="cosine", beta_start=0.0001, beta_end=0.02)
    code = Scheduler(timesteps=1000)
    code.create_noise_schedule("cosine")
    assert torch.equal(readme.betas, code.betas) and code.timesteps == 1000
    code.create_noise_schedule("linear", beta_start=0.001, beta_end=0.01)
    assert torch.allclose(code.betas, torch.linspace(0.001, 0.01, 1000))
    assert torch.allclose(code.alphas_cumprod, torch.cumprod(1 - code.betas.double(), 0).float())
    scaled = Scheduler(timesteps=100)
    scaled.create_noise_schedule("cosine", F=0.5)
    assert torch.allclose(scaled.betas[10:50], Scheduler(max_timesteps=100).betas[10:50] * 0.25)


# --- num_workers ---------------------------------------------------------------------------------


def _losses(run_dir) -> list[float]:
    import json
    from pathlib import Path

    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record]


@pytest.mark.slow
def test_num_workers_load_the_same_batches_and_resume_at_the_trained_position(tmp_path):
    """Worker processes index and collate the same micro-batches in the same order as the training
    process would: the losses equal a run without workers, bitwise. A run stopped at step 3 and
    resumed continues with step 4's samples: its checkpoint holds the trained position, not the
    position the workers had prefetched to."""
    import psutil

    common = dict(batch_size=8, log_every=1, lr_schedule="constant", warmup_steps=0, progress=False)

    def run(folder: str, steps: int, workers: int) -> str:
        torch.manual_seed(0)  # the same initial weights for every run
        p = pipeline(
            tmp_path / folder,
            model_factory=ModelFactory.from_instance(Regressor()),
            **common,
            max_steps=steps,
            num_workers=workers,
        )
        assert p.config().data.num_workers == workers
        before = {child.pid for child in psutil.Process().children()}
        p.run()
        assert {child.pid for child in psutil.Process().children()} <= before  # the workers ended with the run
        return str(tmp_path / folder / "run")

    plain = _losses(run("plain", 6, 0))
    assert len(plain) == 6
    assert _losses(run("workers", 6, 2)) == plain
    run("resumed", 3, 2)
    assert _losses(run("resumed", 6, 2)) == plain
