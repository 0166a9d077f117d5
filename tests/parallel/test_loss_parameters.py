"""A loss with parameters (UncertaintyWeightedLoss) under DDP: its log-variances are gradients DDP
averages like the model's, so 2 ranks learn what 1 process learns from the same global batch."""

from __future__ import annotations

import pytest
import torch

from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]


def _train(rank: int, world: int, out: str) -> torch.Tensor:
    from ditty import L1Loss, ModelFactory, MSELoss, Pipeline, UncertaintyWeightedLoss
    from examples.custom_pipeline import Regressor, SplitTarget, make_rows

    torch.manual_seed(0)
    loss = UncertaintyWeightedLoss([MSELoss(), L1Loss()])
    Pipeline(
        model_factory=ModelFactory.from_instance(Regressor()),
        dataset=make_rows(64),
        loss_calculator=loss,
        preprocessors=[SplitTarget()],
        output_dir=f"{out}/world{world}",
        max_steps=3,
        batch_size=8 // world,  # the same global batch of 8
        lr=5e-2,
        num_threads=1,
        progress=False,
    ).run()
    return loss.log_vars.detach().clone()


def test_loss_parameters_train_alike_on_one_process_and_two_ddp_ranks(tmp_path):
    one = _train(0, 1, str(tmp_path))
    two = run_ranks(_train, 2, str(tmp_path), timeout=240)
    assert not torch.equal(one, torch.zeros(2))
    assert torch.equal(two[0], two[1]) and torch.allclose(two[0], one, atol=1e-6), (one, two)
