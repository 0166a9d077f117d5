"""A run with train.compile says what dynamo compiled, and warns when it fell back to eager.

The fallback is made for real: a custom model whose blocks break the graph inside activation
checkpointing, where dynamo cannot split the checkpointed region and runs every block eagerly.
"""

from __future__ import annotations

import logging

import pytest
import torch

from ditty.loss import MSELoss
from ditty.parallel.compile_report import CompileReport, short_reason
from ditty.pipeline import ModelFactory, Pipeline
from examples.custom_pipeline import SplitTarget, make_rows


class _BreakingBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x))
        torch._dynamo.graph_break()  # what an untraceable call in a user's block does
        return h + x


class _Model(torch.nn.Module):
    contract = "x:2:f32 -> y:2:f32"
    _no_split_modules = ["_BreakingBlock"]

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList(_BreakingBlock() for _ in range(2))
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    before = torch.get_num_threads()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(before)


def test_a_compile_that_falls_back_to_eager_warns_once_with_dynamos_reason(tmp_path, caplog, capsys):
    pipeline = Pipeline(
        model_factory=ModelFactory.from_instance(_Model(), use_compile=True),
        dataset=make_rows(32),
        loss_calculator=MSELoss(),
        preprocessors=[SplitTarget()],
        output_dir=str(tmp_path / "run"),
        gradient_checkpointing=True,
        steps=3,
        batch_size=8,
        device="cpu",
        num_threads=1,
        progress=False,
    )
    with caplog.at_level(logging.WARNING, logger="ditty.train"):
        pipeline.run()
    warnings = [r.getMessage() for r in caplog.records if "fell back to eager" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "0 graphs compiled, 1 graph break (1 compiled unit)" in warnings[0]  # the Python API compiles the model
    assert "Dynamo's reason: Call to `torch._dynamo.graph_break()`" in warnings[0]
    assert 'train.activation_checkpointing = "none"' in warnings[0]
    assert pipeline.trainer.compile_report.graphs == 0
    assert "torch.compile: 0 graphs compiled" in capsys.readouterr().out


def test_the_same_model_without_checkpointing_compiles_around_the_breaks(tmp_path, caplog, capsys):
    pipeline = Pipeline(
        model_factory=ModelFactory.from_instance(_Model(), use_compile=True),
        dataset=make_rows(32),
        loss_calculator=MSELoss(),
        preprocessors=[SplitTarget()],
        output_dir=str(tmp_path / "run"),
        steps=3,
        batch_size=8,
        device="cpu",
        num_threads=1,
        progress=False,
    )
    with caplog.at_level(logging.WARNING, logger="ditty.train"):
        pipeline.run()
    report = pipeline.trainer.compile_report
    # Outside checkpointing dynamo compiles the pieces between the breaks, but a break in every block
    # is as many breaks as compiled units (the whole model, for the Python API): reported.
    assert report.graphs > 0 and report.breaks >= 1 and report.fell_back
    (warning,) = [r.getMessage() for r in caplog.records if "fell back to eager" in r.getMessage()]
    assert "much of the model runs eagerly" in warning and "train.compile_scope" in warning
    assert f"torch.compile: {pipeline.trainer.compile_watch.report().graphs} graphs compiled" in capsys.readouterr().out


def test_when_a_compile_counts_as_fallen_back():
    assert CompileReport(graphs=0, breaks=0, units=4).fell_back
    assert CompileReport(graphs=3, breaks=4, units=4).fell_back
    assert not CompileReport(graphs=3, breaks=1, units=4).fell_back  # one break in a model of 4 blocks
    assert CompileReport(graphs=3, breaks=0, units=4).summary() == "torch.compile: 3 graphs compiled"
    assert CompileReport(graphs=1, breaks=1, units=1).summary() == "torch.compile: 1 graph compiled, 1 graph break"


def test_dynamos_reason_is_shortened_to_one_line():
    text = (
        "HOP: Unsafe side effect\n  Higher Order Operator: torch.utils.checkpoint.checkpoint\n"
        "  Explanation: Mutating a variable from outside the scope of this HOP is not supported.\n"
        "  Hint: try setting x\n\n  Developer debug context: Attempted to mutate Foo\n\n For more details"
    )
    assert short_reason(text) == (
        "HOP: Unsafe side effect Explanation: Mutating a variable from outside the scope of this HOP is not "
        "supported. Developer debug context: Attempted to mutate Foo"
    )


def test_decoding_a_compiled_model_runs_eagerly_instead_of_recompiling_per_token(tmp_path):
    from ditty.data.task import greedy_generate
    from tests.train.speed_helpers import tiny_config, train

    trainer, _ = train(tiny_config(tmp_path, steps=2, train=dict(compile=True)))
    compiled = trainer.compile_watch.report().graphs
    model = trainer.model
    texts = greedy_generate(model, trainer.tokenizer, ["12+7=", "3+4="], "cpu", max_new_tokens=12)
    assert len(texts) == 2
    # Each new length and KV-cache stride would be a recompile of every block, up to dynamo's limit.
    assert trainer.compile_watch.report().graphs == compiled
