"""Pipeline components that the pipeline-rule tests name in recipes ("tests.recipe.stages:Name")."""

from __future__ import annotations

import torch

from ditty.loss import LossCalculator, MSELoss
from ditty.processors import PostProcessor, PreProcessor

CALLS: list[str] = []
"""Constructors append here: the tests prove that a refused recipe constructs nothing."""


class Stage(PreProcessor):
    """A preprocessor whose contract is its argument."""

    def __init__(self, contract: str = "x:4:f32 -> x:4:f32") -> None:
        CALLS.append("Stage")
        super().__init__(contract=contract)

    def process(self, batch, ctx):
        return batch, ctx


class Post(PostProcessor):
    def __init__(self, contract: str = "eps:4:f32 -> eps:4:f32") -> None:
        CALLS.append("Post")
        super().__init__(contract=contract)

    def process(self, model_output, ctx):
        return model_output, ctx


class ContractLoss(MSELoss):
    def __init__(self, contract: str = "eps:4:f32, ctx.target:4:f32 -> loss:0:f32", output_index: int = 0) -> None:
        super().__init__(output_index=output_index, contract=contract)


class Abstract(LossCalculator):
    """Does not implement compute()."""


class NotAStage:
    def __init__(self) -> None:
        CALLS.append("NotAStage")


def unannotated_factory(width: int = 4):
    CALLS.append("unannotated_factory")
    return torch.nn.Linear(width, width)


def dict_factory(width: int = 4) -> dict:
    CALLS.append("dict_factory")
    return {}


class TwoHeads(torch.nn.Module):
    """forward(x) -> (eps, logits): a model with two outputs."""

    contract = "x:4:f32, ctx.forward_kwargs.t:1:i64 -> eps:4:f32, logits:2:f32"

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x, t=None):
        return self.lin(x.reshape(len(x), -1)).reshape(x.shape), x.reshape(len(x), -1)[:, :10]
