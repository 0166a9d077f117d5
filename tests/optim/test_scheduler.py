"""build_scheduler: the learning rate at known steps for every kind, and resume."""

from __future__ import annotations

import math

import pytest
import torch

from ditty.config.errors import RecipeError
from ditty.config.sections import SchedulerConfig
from ditty.optim import build_scheduler, check_scheduler

PEAK = 1.0


def _rates(config: SchedulerConfig, total: int) -> list[float]:
    """The rate each optimizer step trains at."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    scheduler = build_scheduler(config, optimizer, total)
    rates = []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_warmup_starts_above_zero_and_reaches_the_peak():
    rates = _rates(SchedulerConfig(kind="constant", warmup_steps=4), 8)
    assert rates == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0])


def test_constant_ignores_the_floor():
    assert _rates(SchedulerConfig(kind="constant", min_lr_ratio=0.5), 3) == [1.0, 1.0, 1.0]


def test_linear_decays_towards_the_floor():
    rates = _rates(SchedulerConfig(kind="linear", warmup_steps=2, min_lr_ratio=0.2), 10)
    # 8 decay steps from 1.0 towards 0.2: 0.1 less per step; the floor is reached at step 10.
    assert rates == pytest.approx([0.5, 1.0, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3])


def test_cosine_follows_half_a_cosine():
    rates = _rates(SchedulerConfig(kind="cosine", warmup_steps=0, min_lr_ratio=0.1), 8)
    expected = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / 8)) for s in range(8)]
    assert rates == pytest.approx(expected)
    assert rates[4] == pytest.approx(0.55)  # halfway: midway between peak and floor


def test_wsd_warms_up_holds_then_decays_for_its_fraction():
    rates = _rates(SchedulerConfig(kind="wsd", warmup_steps=2, min_lr_ratio=0.0, decay_fraction=0.4), 10)
    # 4 decay steps (40% of 10) start at step 6.
    assert rates == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25])


@pytest.mark.parametrize("optimizer_first", [True, False])
def test_state_dict_round_trips_in_either_load_order(optimizer_first):
    """Plain LambdaLR applies a loaded step only at its next step(); loading the optimizer first
    would then train one step at the rate of step 0."""
    config = SchedulerConfig(kind="cosine", warmup_steps=3, min_lr_ratio=0.1)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    scheduler = build_scheduler(config, optimizer, 20)
    for _ in range(7):
        optimizer.step()
        scheduler.step()
    optimizer_state, scheduler_state = optimizer.state_dict(), scheduler.state_dict()

    resumed_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    if optimizer_first:
        resumed_optimizer.load_state_dict(optimizer_state)
    resumed = build_scheduler(config, resumed_optimizer, 20)
    if not optimizer_first:
        resumed_optimizer.load_state_dict(optimizer_state)
    resumed.load_state_dict(scheduler_state)
    for _ in range(5):
        assert resumed_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
        for opt, sched in ((optimizer, scheduler), (resumed_optimizer, resumed)):
            opt.step()
            sched.step()


def test_a_resumed_run_follows_the_recipes_shape():
    """The state holds the step only: resuming with more steps decays over the new length."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    scheduler = build_scheduler(SchedulerConfig(kind="linear"), optimizer, 10)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    longer = build_scheduler(SchedulerConfig(kind="linear"), optimizer, 20)
    longer.load_state_dict(scheduler.state_dict())
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.75)


def test_every_param_group_follows_its_own_peak():
    optimizer = torch.optim.SGD(
        [
            {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 1.0},
            {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.5},
        ],
        lr=1.0,
    )
    build_scheduler(SchedulerConfig(kind="constant", warmup_steps=2), optimizer, 4)
    assert [g["lr"] for g in optimizer.param_groups] == [0.5, 0.25]


def test_impossible_settings_are_recipe_errors():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    with pytest.raises(RecipeError, match="never reach its peak"):
        build_scheduler(SchedulerConfig(warmup_steps=11), optimizer, 10)
    assert [p.key for p in check_scheduler(SchedulerConfig(min_lr_ratio=1.5, decay_fraction=-0.1))] == [
        "scheduler.min_lr_ratio",
        "scheduler.decay_fraction",
    ]
    assert check_scheduler(SchedulerConfig(warmup_steps=11)) == []  # the run length is not known yet
