"""The Python API: Pipeline(...) is a facade over the one Trainer; its checks stop bad input at construction."""

from __future__ import annotations

import json
import re

import pytest
import torch

from ditty.config.errors import RecipeError
from ditty.data.batching import BatchStream
from ditty.data.generic import SampleCollator
from ditty.loss import CompositeLoss, CrossEntropyLoss, MSELoss
from ditty.pipeline import Data, FSDPConfig, ModelFactory, Pipeline
from ditty.processors import PostProcessor, PreProcessor
from ditty.train import Trainer
from examples.custom_pipeline import Regressor, SplitTarget, make_rows


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def pipeline(tmp_path, **kwargs):
    args = dict(
        model_factory=ModelFactory.from_instance(Regressor()),
        dataset=make_rows(64),
        loss_calculator=MSELoss(),
        preprocessors=[SplitTarget()],
        output_dir=str(tmp_path / "run"),
        lr=1e-2,
        steps=6,
        batch_size=8,
        device="cpu",
        num_threads=1,
        progress=False,
        log_every=1,
    )
    args.update(kwargs)
    return Pipeline(**args)


def records(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


def test_pipeline_runs_the_trainer_on_a_custom_model(tmp_path):
    p = pipeline(tmp_path, grad_accum=2, val_dataset=make_rows(16, seed=1))
    config = p.config()
    assert config.train.global_batch_size == 16 and config.train.micro_batch_size == 8  # micro x accum x world
    result = p.run()
    assert isinstance(p.trainer, Trainer) and result.steps == 6
    rows = records(result.run_dir)
    assert rows[-1]["tokens"] == 6 * 16  # samples for generic data
    assert "val_loss" in rows[-1]
    # mfu of a custom model: its FLOPs counted on the first training forward (ditty.metrics.mfu)
    assert all(0 < row["mfu"] < 1 for row in rows), [row["mfu"] for row in rows]
    recipe = open(f"{result.run_dir}/recipe.toml").read()
    assert "NOT re-runnable from this file alone" in recipe and "# model: <python object Regressor>" in recipe
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()


def test_any_split_of_the_global_batch_gives_the_same_loss(tmp_path):
    losses = []
    for micro, accum in ((8, 2), (16, 1), (4, 4)):
        torch.manual_seed(0)
        model = Regressor()
        result = pipeline(
            tmp_path / f"{micro}",
            model_factory=ModelFactory.from_instance(model),
            batch_size=micro,
            grad_accum=accum,
            steps=3,
        ).run()
        losses.append([r["loss"] for r in records(result.run_dir)])
    assert losses[0] == pytest.approx(losses[1], rel=1e-4) and losses[0] == pytest.approx(losses[2], rel=1e-4)


def test_generic_stream_order_does_not_depend_on_world_size():
    data = list(torch.arange(40).float())

    def stream(**geometry):  # the Python API's samples in the one global order (ditty.train.data_modes)
        return BatchStream(data, collator=SampleCollator(), measure=False, global_batch_size=8, seed=3, **geometry)

    one = stream(micro_batch_size=8, rank=0, world_size=1)
    two = [stream(micro_batch_size=2, rank=r, world_size=2) for r in range(2)]
    for _ in range(7):  # crosses an epoch boundary
        whole = torch.cat(one.next_step())
        parts = torch.cat([torch.cat(s.next_step()) for s in two])
        assert torch.equal(whole, parts)


def test_fp16_and_bf16_together_are_refused(tmp_path):
    with pytest.raises(RecipeError, match="fp16 and bf16"):
        pipeline(tmp_path, fp16=True, bf16=True)


def test_options_map_to_recipe_sections(tmp_path):
    class Block(torch.nn.Module):
        pass

    c = pipeline(tmp_path, use_8bit_optim=True, optim_backend="bnb", epochs=3, bf16=True).config()
    assert (c.optimizer.kind, c.optimizer.backend, c.train.precision, c.train.epochs) == (
        "adamw8bit",
        "bnb",
        "bf16",
        3.0,
    )
    fsdp = ModelFactory.from_instance(Regressor(), fsdp_config=FSDPConfig(enabled=True, transformer_layers=[Block]))
    c = pipeline(tmp_path, model_factory=fsdp, use_8bit_optim=True).config()
    assert (c.parallel.kind, c.parallel.block_classes, c.optimizer.backend) == ("fsdp", ["Block"], "torchao")
    with pytest.raises(RecipeError, match="bitsandbytes"):  # the compiler's compatibility table applies too
        pipeline(tmp_path, model_factory=fsdp, use_8bit_optim=True, optim_backend="bnb")
    with pytest.raises(RecipeError, match="fp8"):  # no FP8 hardware on this CPU: refused at construction
        pipeline(tmp_path, accelerator_kwargs={"mixed_precision": "fp8"})


def test_a_chain_that_does_not_fit_stops_at_construction(tmp_path):
    with pytest.raises(RecipeError) as caught:
        pipeline(tmp_path, preprocessors=[SplitTarget(rank=3)])
    assert "model (Regressor)" in str(caught.value) and "rank 2" in str(caught.value)
    assert not (tmp_path / "run").exists()


def test_a_loss_index_the_model_does_not_produce_stops_at_construction(tmp_path):
    with pytest.raises(RecipeError, match=r"loss \(MSELoss\).*output_index 1 does not exist"):
        pipeline(tmp_path, loss_calculator=MSELoss(output_index=1))


def test_objects_of_the_wrong_kind_are_refused(tmp_path):
    with pytest.raises(RecipeError) as caught:
        pipeline(tmp_path, preprocessors=[object()], loss_calculator=lambda out, ctx: out)
    assert "preprocessors[0]" in str(caught.value) and "loss_calculator" in str(caught.value)


def test_first_step_check_compares_real_tensors(tmp_path):
    class Liar(PreProcessor):
        """Declares an int64 output but passes floats on."""

        def __init__(self):
            super().__init__(contract="rows:2:f32 -> x:2:i64 | ctx.target:2:f32")

        def process(self, batch, ctx):
            ctx["target"] = batch[:, 4:]
            return batch[:, :4], ctx

    class IntModel(Regressor):
        contract = "x:2:i64 -> y:2:f32"

    p = pipeline(tmp_path, model_factory=ModelFactory.from_instance(IntModel()), preprocessors=[Liar()])
    with pytest.raises(RecipeError, match=r"pipeline.preprocessors\[0\] \(Liar\).*dtype i64 declared"):
        p.run()
    pipeline(
        tmp_path / "off",
        model_factory=ModelFactory.from_instance(IntModel()),
        preprocessors=[Liar()],
        check_contracts=False,
    ).run()  # the check can be turned off


def test_a_contract_break_that_crashes_the_forward_names_the_stage(tmp_path):
    """A stage whose output breaks its contract so badly that the model's forward fails: the error
    is the contract's (naming the stage), with torch's as its cause, not torch's alone."""

    class Flattens(PreProcessor):
        def __init__(self):
            super().__init__(contract="rows:2:f32 -> x:2:f32 | ctx.target:2:f32")

        def process(self, batch, ctx):
            ctx["target"] = batch[:, 4:]
            return batch[:, 0], ctx  # [B], not [B, 4]

    with pytest.raises(RecipeError, match=r"pipeline.preprocessors\[0\] \(Flattens\).*rank 2 declared") as caught:
        pipeline(tmp_path, preprocessors=[Flattens()]).run()
    assert isinstance(caught.value.__cause__, RuntimeError)  # the forward's own error stays readable


def test_composite_loss_and_postprocessor(tmp_path):
    class TwoOutputs(Regressor):
        def forward(self, x):
            y = super().forward(x)
            return y, torch.cat([y, -y], dim=1)

    class ClassTarget(PostProcessor):
        def process(self, model_output, ctx):
            ctx["label"] = (ctx["target"][:, 0] > 0).long()
            return model_output, ctx

    loss = CompositeLoss([(MSELoss(), 1.0), (CrossEntropyLoss(output_index=1, target_key="label"), 0.1)])
    result = pipeline(
        tmp_path,
        model_factory=ModelFactory.from_instance(TwoOutputs()),
        loss_calculator=loss,
        postprocessors=[ClassTarget()],
    ).run()
    last = records(result.run_dir)[-1]
    assert {"mse", "cross_entropy"} <= set(last)


def test_dataloader_and_subclassed_dataset(tmp_path):
    loader = torch.utils.data.DataLoader(
        make_rows(64), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    p = pipeline(tmp_path / "a", dataset=None, dataloader=loader, grad_accum=2, steps=None, epochs=1)
    result = p.run()
    assert result.steps == 8 and p.trainer.config.train.micro_batch_size == 4  # 64 samples / (4 x 2)

    class OldStyle(Pipeline):
        def dataset(self):
            return torch.utils.data.DataLoader(make_rows(32), batch_size=8)

    result = OldStyle(
        ModelFactory.from_instance(Regressor()),
        loss_calculator=MSELoss(),
        preprocessors=[SplitTarget()],
        output_dir=str(tmp_path / "b"),
        steps=3,
        device="cpu",
        progress=False,
    ).run()
    assert result.steps == 3


def test_from_checkpoint_loads_plain_weights(tmp_path):
    trained = Regressor()
    torch.save({"model": trained.state_dict()}, tmp_path / "w.pt")
    model = ModelFactory.from_checkpoint(str(tmp_path / "w.pt"), Regressor, hidden=32).build()
    assert torch.equal(model.fc1.weight, trained.fc1.weight)
    result = pipeline(tmp_path, steps=1).run()
    again = ModelFactory.from_checkpoint(f"{result.run_dir}/final", Regressor).build()  # a run's final/ (safetensors)
    assert again.fc2.weight.shape == (1, 32)
    torch.save({"code": object()}, tmp_path / "pickled.pt")
    with pytest.raises(RecipeError, match="plain weights"):
        ModelFactory.from_checkpoint(str(tmp_path / "pickled.pt"), Regressor).build()


def test_lora_on_a_custom_model(tmp_path):
    p = pipeline(tmp_path, extra_config={"peft": {"kind": "lora", "r": 4, "target_modules": ["fc1"]}})
    result = p.run()
    names = [n for n, prm in p.trainer.model.named_parameters() if prm.requires_grad]
    assert names and all("lora_" in n for n in names) and result.steps == 6


def test_data_prepare_over_a_hf_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    from ditty.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    raw = datasets.Dataset.from_dict(
        {"text": [f"sample {i} " + "x" * (i % 7) for i in range(40)], "id": list(range(40))}
    )

    def tokenize(rows):
        return {"input_ids": [tokenizer(t)["input_ids"] for t in rows["text"]]}

    data = Data(dataset=raw, tokenizer=tokenizer, batch_size=4, grad_accum=2, seed=0, group_by_length=True)
    loader = data.prepare([("filter", lambda row: row["id"] % 5 != 0, {}), ("map", tokenize, {"batched": True})])
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}  # text and id removed
    assert len(loader.dataset) == 32 and batch["input_ids"].shape[0] == 4
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()


def test_data_loads_a_file_through_datasets_and_names_a_failed_load(tmp_path):
    """Data(load_kwargs=...) reads a local file with datasets.load_dataset; a load that fails (a
    builder that does not exist here) is a RecipeError naming the call, not a traceback."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(6)))
    loaded = Data(load_kwargs={"path": "json", "data_files": str(rows), "split": "train"}).load()
    assert loaded["text"] == [f"row {i}" for i in range(6)]
    with pytest.raises(RecipeError, match=r"datasets.load_dataset\(.*no_such_builder.*\) failed"):
        Data(load_kwargs={"path": str(tmp_path / "no_such_builder"), "split": "train"}).load()


@pytest.mark.parametrize(
    ("keywords", "words"),
    [
        ({"load_kwargs": "json"}, "`Data.load_kwargs` is a str"),
        ({"dataset": [1], "batch_size": 0}, "`Data.batch_size` is 0"),
        ({"dataset": [1], "grad_accum": 1.5}, "`Data.grad_accum` is 1.5"),
        ({"dataset": [1], "num_workers": -1}, "`Data.num_workers` is -1"),
    ],
)
def test_data_settings_of_the_wrong_kind_are_named(keywords, words):
    with pytest.raises(RecipeError, match=re.escape(words)):
        Data(**keywords)


def test_resume_within_the_same_script(tmp_path):
    torch.manual_seed(0)
    first = pipeline(tmp_path, steps=4, checkpoint_every=2).run()
    assert first.steps == 4
    torch.manual_seed(0)
    second = pipeline(tmp_path, steps=6, checkpoint_every=2).run()  # same output_dir: continues from step 4
    assert second.steps == 6
    steps = [r["step"] for r in records(second.run_dir)]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_a_finished_run_and_a_trainer_trained_twice(tmp_path, capsys):
    """A second run() of the same pipeline finds the run finished and advises the setting it lacks
    (not a flag it already has); a second train() of one Trainer is refused before it re-saves final/."""
    first = pipeline(tmp_path, steps=3)
    first.run()
    final = tmp_path / "run" / "final"
    written = {p.name: p.stat().st_mtime_ns for p in final.iterdir()}
    capsys.readouterr()
    again = first.run()
    said = capsys.readouterr().out
    assert again.steps == 3 and "is a finished run" in said and "raise train.steps" in said
    assert "--checkpoint.overwrite_finished" not in said  # load_checkpoint=True has set it
    trainer = pipeline(tmp_path / "b", steps=2).build_trainer()
    trainer.train()
    with pytest.raises(RecipeError, match=r"`Trainer.train` this Trainer has run train\(\) already"):
        trainer.train()
    assert {p.name: p.stat().st_mtime_ns for p in final.iterdir()} == written


def test_a_loss_metric_is_logged_as_its_mean_over_the_logging_interval(tmp_path):
    """A record every 3 steps carries the mean of the 3 steps' metric, as the loss is, not the third's."""
    from ditty.loss import LossOutput

    class MSEWithMean(MSELoss):
        def __call__(self, output, ctx):
            out = super().__call__(output, ctx)
            return LossOutput(loss=out.loss, metrics={"mean_prediction": float(output.mean())})

    runs = {}
    for every in (1, 3):
        torch.manual_seed(0)
        result = pipeline(tmp_path / f"every{every}", steps=3, log_every=every, loss_calculator=MSEWithMean()).run()
        runs[every] = [r for r in records(result.run_dir) if "loss" in r]
    per_step = [r["mean_prediction"] for r in runs[1]]
    assert len(set(per_step)) == 3  # the metric moves from step to step
    assert runs[3][-1]["mean_prediction"] == pytest.approx(sum(per_step) / 3, rel=1e-9)
    assert runs[3][-1]["loss"] == pytest.approx(sum(r["loss"] for r in runs[1]) / 3, rel=1e-6)


def test_the_readme_imports():
    from ditty import CompositeLoss as C  # noqa: F401
    from ditty import FSDPConfig as F
    from ditty import ModelFactory as M
    from ditty import Pipeline as P
    from ditty.processors import Context, PostProcessor, PreProcessor  # noqa: F401

    assert P is Pipeline and M is ModelFactory and F is FSDPConfig and C is CompositeLoss


def test_objects_of_the_wrong_kind_are_all_named(tmp_path):
    class NotALoss:
        pass

    with pytest.raises(RecipeError) as raised:
        Pipeline(
            model_factory="a model",
            dataset=make_rows(8),
            loss_calculator=NotALoss(),
            preprocessors=[SplitTarget(), "a function"],
            postprocessors=[None],
            metrics_logger=object(),
            output_dir=str(tmp_path / "run"),
        )
    text = raised.value.format()
    for line in (
        "`preprocessors[1]` str is not a PreProcessor",
        "`postprocessors[0]` NoneType is not a PostProcessor",
        "`loss_calculator` NotALoss is not a LossCalculator",
        "`model_factory` str is not a ModelFactory or nn.Module",
        "`metrics_logger` object has no log_scalar()",
    ):
        assert line in text, text
    assert "preprocessors[0]" not in text


@pytest.mark.parametrize(
    "returned, words",
    [
        ("float", "returned float: a loss calculator returns a LossOutput"),
        ("detached", "returned a loss that does not require grad"),
        ("per_row", "returned a LossOutput whose loss is a tensor of shape (8, 1): it must be a scalar tensor"),
        ("text_metric", "returned the metric 'note' = 'abc': metrics are numbers"),
    ],
)
def test_a_loss_that_returns_the_wrong_thing_is_named(tmp_path, returned, words):
    from ditty.stages.loss import LossOutput

    class Odd(MSELoss):
        def compute(self, model_output, ctx):
            error = (self.get_prediction(model_output) - self.get_target(ctx)) ** 2
            return {
                "float": lambda: float(error.mean()),
                "detached": lambda: LossOutput(loss=error.mean().detach()),
                "per_row": lambda: LossOutput(loss=error),
                "text_metric": lambda: LossOutput(loss=error.mean(), metrics={"note": "abc"}),
            }[returned]()

    with pytest.raises(RecipeError, match=re.escape(f"Odd {words}")):
        pipeline(tmp_path, loss_calculator=Odd()).run()


def test_a_stage_that_returns_its_data_alone_is_named(tmp_path):
    class Forgetful(SplitTarget):
        def process(self, batch, ctx):
            return super().process(batch, ctx)[0]

    with pytest.raises(RecipeError, match=re.escape("`pipeline.preprocessors[0]` (Forgetful).process returned Tensor")):
        pipeline(tmp_path, preprocessors=[Forgetful()]).run()


def test_preference_beside_another_loss_is_refused(tmp_path, tiny_llama_dir):
    pairs = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}] * 8
    with pytest.raises(RecipeError, match="preference= trains with its kind's preference loss"):
        Pipeline(
            model_factory=ModelFactory.from_huggingface(tiny_llama_dir),
            dataset=pairs,
            preference={"kind": "dpo"},
            loss_calculator=MSELoss(),
            output_dir=str(tmp_path / "run"),
        )


def hugging_face_pipeline(tmp_path, model_dir, rows, **keywords):
    """Two steps of 4 rows on the tiny Llama, on the CPU."""
    return Pipeline(
        model_factory=ModelFactory.from_huggingface(model_dir),
        dataset=rows,
        output_dir=str(tmp_path / "run"),
        steps=2,
        batch_size=4,
        device="cpu",
        progress=False,
        **keywords,
    )


@pytest.mark.parametrize(
    "rows, data_format",
    [
        ([{"prompt": f"{a}+1=", "completion": str(a + 1)} for a in range(8)], "prompt_completion"),
        ([{"text": f"{a}+1={a + 1}"} for a in range(8)], "text"),
        (
            [
                {"messages": [{"role": "user", "content": f"{a}+1="}, {"role": "assistant", "content": str(a + 1)}]}
                for a in range(8)
            ],
            "chat",
        ),
    ],
)
def test_rows_of_text_train_a_hugging_face_model(tmp_path, tiny_llama_dir, rows, data_format):
    """Rows of text are tokenized as the recipe's data of the format the first row shows."""
    p = hugging_face_pipeline(tmp_path, tiny_llama_dir, rows, log_every=1)
    assert p.config().data.format == data_format
    result = p.run()
    losses = [r["loss"] for r in records(result.run_dir) if "loss" in r]
    assert result.steps == 2 and len(losses) == 2 and all(loss > 0 for loss in losses)


@pytest.mark.parametrize(
    "keywords, words",
    [
        ({"device": "gpu"}, '`run.device` string "gpu" is not a valid choice'),
        ({"lr_schedule": "cosinee"}, '`scheduler.kind` string "cosinee" is not a valid choice'),
        ({"lr": "1e-3"}, '`optimizer.lr` expected a float, got string "1e-3"'),
        ({"batch_size": 2.5}, "`train.micro_batch_size` expected an integer, got float 2.5"),
        ({"output_dir": None}, "`run.output_dir` expected a string"),
        ({"extra_config": {"train": {"steps": "many"}}}, '`train.steps` expected an integer, got string "many"'),
    ],
)
def test_values_of_the_wrong_type_from_python_are_refused_as_in_a_recipe(tmp_path, keywords, words):
    """The compiler holds a config built in code to the types a TOML recipe is held to, before any
    other rule reads the values."""
    with pytest.raises(RecipeError) as caught:
        pipeline(tmp_path, **keywords)
    assert words in str(caught.value), str(caught.value)


def test_an_output_dir_path_is_taken_and_a_numpy_number_is_named(tmp_path):
    import numpy as np

    assert pipeline(tmp_path, output_dir=tmp_path / "run", steps=2).run().steps == 2
    with pytest.raises(RecipeError, match=r"`optimizer.lr` expected a float, got float32"):
        pipeline(tmp_path / "other", lr=np.float32(1e-2))


@pytest.mark.parametrize(
    "keywords, words",
    [
        ({"preprocessors": SplitTarget()}, "`preprocessors` takes a list of stages, got SplitTarget"),
        ({"preprocessors": "split"}, "`preprocessors` takes a list of stages, got str"),
        (
            {"model_factory": ModelFactory.from_instance(Regressor(), fsdp_config=FSDPConfig(enabled="no"))},
            "`fsdp_config.enabled` FSDPConfig(enabled='no') is not a boolean",
        ),
        (
            {
                "model_factory": ModelFactory.from_instance(
                    Regressor(), fsdp_config=FSDPConfig(enabled=True, transformer_layers=torch.nn.Linear)
                )
            },
            "`fsdp_config.transformer_layers`",
        ),
    ],
)
def test_stage_lists_and_fsdp_settings_of_the_wrong_kind_are_named(tmp_path, keywords, words):
    with pytest.raises(RecipeError) as caught:
        pipeline(tmp_path, **keywords)
    assert words in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "parts, words",
    [
        ([(torch.nn.MSELoss(), 1.0)], "part 0 holds a torch.nn.modules.loss.MSELoss, not a ditty LossCalculator"),
        ([MSELoss()], "part 0 is a MSELoss, not a (loss, weight) pair"),
        ([(MSELoss(), 1.0), (MSELoss(), "half")], "part 1 has the weight 'half', not a number"),
    ],
)
def test_composite_loss_parts_of_the_wrong_kind_are_named(parts, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        CompositeLoss(parts)


@pytest.mark.parametrize(
    "rows, objective, words",
    [
        ([{"prompt": "1+1=", "answer": "2"}] * 8, "preference", "column 'chosen' is missing from the training dataset"),
        (
            [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}] * 8,
            "distill",
            "column 'completion' is missing from the training dataset (columns found: prompt, chosen, rejected)",
        ),
    ],
)
def test_an_objective_on_rows_without_its_columns_names_the_missing_one(
    tmp_path, tiny_llama_dir, rows, objective, words
):
    keywords = (
        {"preference": {"kind": "dpo"}}
        if objective == "preference"
        else {
            "distill": {"teacher": tiny_llama_dir},
            "rollout": {"max_new_tokens": 8},
            "extra_config": {"data": {"max_seq_len": 32}},  # a rollout within the model's 256 positions
        }
    )
    p = hugging_face_pipeline(tmp_path, tiny_llama_dir, rows, **keywords)
    with pytest.raises(RecipeError, match=re.escape(words)):
        p.run()
