"""`Pipeline.run()` under torchrun destroys the process group it created, and only that one."""

from __future__ import annotations

import pytest

from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]


def _pipeline_runs(rank: int, world: int, out: str) -> tuple[bool, bool]:
    """Returns (group alive after a run given one, group alive after a run that created it)."""
    import os

    import torch.distributed as dist

    from ditty.loss import MSELoss
    from ditty.pipeline import ModelFactory, Pipeline
    from examples.custom_pipeline import Regressor, SplitTarget, make_rows
    from tests.parallel.harness import free_port

    def run(name: str) -> None:
        Pipeline(
            model_factory=ModelFactory.from_instance(Regressor()),
            dataset=make_rows(32),
            loss_calculator=MSELoss(),
            preprocessors=[SplitTarget()],
            output_dir=f"{out}/{name}",
            steps=2,
            batch_size=4,
            device="cpu",
            num_threads=1,
            progress=False,
        ).run()

    run("given")  # the harness made the group, as a script that calls init_process_group itself
    after_given = dist.is_initialized()
    # Start again as torchrun does, with no group: a fresh rendezvous port, so no rank can reach the old store.
    port = [free_port() if rank == 0 else None]
    dist.broadcast_object_list(port)
    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(port[0])
    run("created")
    return after_given, dist.is_initialized()


def test_pipeline_destroys_only_the_process_group_it_created(tmp_path):
    results = run_ranks(_pipeline_runs, 2, str(tmp_path), timeout=240)
    assert results == [(True, False), (True, False)]
