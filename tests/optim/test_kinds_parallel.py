"""The new optimizer kinds on 2 real gloo ranks against 1 process, 5 steps of the same global batch.

DDP: every kind within 1e-6 (final weights, relative; losses). FSDP2: RAdam and schedule-free AdamW
within 1e-5 (their updates are elementwise, so shards are exact); Muon and Adafactor are refused by
the compiler (they need whole matrices), which the last test pins.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ditty.config.sections import OptimizerConfig, SchedulerConfig
from tests.parallel.harness import run_ranks
from tests.train.test_distributed import _train_all, final_weights, losses, relative_error, tiny_config

KINDS = {
    "radam": OptimizerConfig(kind="radam", lr=3e-3, weight_decay=0.1),
    "muon": OptimizerConfig(kind="muon", lr=3e-3, weight_decay=0.1),
    "adafactor": OptimizerConfig(kind="adafactor", lr=1e-2, weight_decay=0.1),
    "adamw_schedulefree": OptimizerConfig(kind="adamw_schedulefree", lr=3e-3, weight_decay=0.1),
}
STEPS = 5
ELEMENTWISE = ("radam", "adamw_schedulefree")
"""Kinds whose update is elementwise: FSDP2's shards give exactly one process's update."""

# One worker runs the module: its fixture trains every kind on one process and on two ranks, which
# each xdist worker handed one of its tests would otherwise do again.
pytestmark = pytest.mark.xdist_group("optim_kinds")


def config_for(out: str, kind: str, *, micro: int, parallel: str = "none"):
    base = tiny_config(out, micro=micro, parallel=parallel, steps=STEPS)
    # One thread everywhere (each rank runs one): the same matmul reduction order, so the same
    # gradients; Muon's Newton-Schulz runs in bfloat16 and would turn a last-bit difference into 1e-3.
    run = replace(base.run, num_threads=1)
    return replace(base, run=run, optimizer=KINDS[kind], scheduler=SchedulerConfig(kind="constant"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from ditty.train import Trainer

    root = tmp_path_factory.mktemp("kinds")
    for kind in KINDS:
        Trainer(config_for(str(root / f"single-{kind}"), kind, micro=4)).train()
    parallel = [config_for(str(root / f"ddp-{kind}"), kind, micro=4, parallel="ddp") for kind in KINDS]
    for elementwise in ELEMENTWISE:
        parallel.append(config_for(str(root / f"fsdp-{elementwise}"), elementwise, micro=4, parallel="fsdp"))
    run_ranks(_train_all, 2, parallel, timeout=600)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_two_ddp_ranks_equal_one_process(runs, kind):
    single, ddp = str(runs / f"single-{kind}"), str(runs / f"ddp-{kind}")
    assert relative_error(final_weights(ddp), final_weights(single)) <= 1e-6
    assert losses(ddp) == pytest.approx(losses(single), rel=1e-6, abs=0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ELEMENTWISE)
def test_elementwise_kinds_under_fsdp2_equal_one_process(runs, kind):
    single, fsdp = str(runs / f"single-{kind}"), str(runs / f"fsdp-{kind}")
    assert relative_error(final_weights(fsdp), final_weights(single)) <= 1e-5
    assert losses(fsdp) == pytest.approx(losses(single), rel=1e-5, abs=0)


@pytest.mark.parametrize("kind", ["muon", "adafactor"])
def test_fsdp_and_hsdp_refuse_the_kinds_that_need_whole_matrices(tmp_path, kind):
    from ditty.recipe import compile_config

    for parallel, world in (("fsdp", 2), ("hsdp", 4)):
        config = config_for(str(tmp_path / "run"), kind, micro=1, parallel=parallel)
        errors = compile_config(config, world_size=world).errors
        assert [e.rule for e in errors] == [f"compat.{kind}-fsdp"], errors
        assert "whole" in errors[0].message or "all rows" in errors[0].message
