"""The multi-process harness names what every rank did when one fails: a rank killed from outside
shows up as its own signal, not only as its peer's "Connection reset by peer"."""

from __future__ import annotations

import os
import signal

import pytest

from tests.parallel.harness import run_ranks

pytestmark = pytest.mark.xdist_group("parallel")


def _rank_one_killed(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(4))


def _rank_one_raises(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("rank 1 broke on purpose")
    dist.all_reduce(torch.ones(4))


def test_a_rank_killed_from_outside_is_named_beside_its_peers_error():
    with pytest.raises(AssertionError) as failed:
        run_ranks(_rank_one_killed, 2, timeout=120, collective_timeout=10)
    report = str(failed.value)
    assert "rank 1: died from SIGKILL" in report, report
    assert "rank 0 failed:" in report, report  # its collective lost the peer (reset or timed out)


def test_every_failing_rank_traceback_is_shown():
    with pytest.raises(AssertionError) as failed:
        run_ranks(_rank_one_raises, 2, timeout=120, collective_timeout=10)
    report = str(failed.value)
    assert "rank 1 failed:" in report and "ValueError: rank 1 broke on purpose" in report, report
