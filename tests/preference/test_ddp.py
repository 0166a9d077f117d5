"""2 ranks (real gloo processes: DDP, FSDP2, HSDP) give the losses of 1 process over 5 DPO steps,
with each kind of reference: the adapter disabled, a frozen copy of the starting weights, a separate
checkpoint (both sharded like the policy under FSDP), and the precomputed table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ditty.config.sections import ParallelConfig, PeftConfig
from tests.parallel.harness import run_ranks
from tests.preference import workers
from tests.preference.test_loss import _config, reference_dir  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]


def _five_steps(tmp_path, tiny_llama_dir, reference=None, lora=True):
    config = _config(tmp_path, tiny_llama_dir, "dpo", reference=reference)
    if lora:
        config = replace(config, peft=PeftConfig(kind="lora", r=4, alpha=8))
    return replace(config, train=replace(config.train, steps=5, global_batch_size=4, micro_batch_size=1))


def _single(tmp_path, config) -> list[float]:
    losses = workers.dpo_losses(0, 1, replace(config, run=replace(config.run, output_dir=str(tmp_path / "one"))), 5)
    assert len(set(losses)) > 1  # it trains
    return losses


def _assert_equal(single, ranks):
    assert ranks[0] == ranks[1]
    for one, two in zip(single, ranks[0]):
        assert two == pytest.approx(one, abs=1e-6)


def test_two_ddp_ranks_give_the_losses_of_one_process(tmp_path, tiny_llama_dir):
    config = _five_steps(tmp_path, tiny_llama_dir)
    single = _single(tmp_path, config)
    ddp = replace(
        config, parallel=ParallelConfig(kind="ddp"), run=replace(config.run, output_dir=str(tmp_path / "two"))
    )
    _assert_equal(single, run_ranks(workers.dpo_losses, 2, ddp, 5, timeout=240))


@pytest.mark.parametrize(
    "parallel, reference, lora, held",
    [
        (ParallelConfig(kind="fsdp"), "auto", True, "adapter"),
        (ParallelConfig(kind="fsdp"), "auto", False, "sharded"),
        (ParallelConfig(kind="fsdp"), "path", False, "sharded"),
        (ParallelConfig(kind="hsdp", replicate_size=2), "precompute", True, "table"),
    ],
    ids=["fsdp-lora-auto", "fsdp-full-auto", "fsdp-full-path", "hsdp-lora-precompute"],
)
def test_two_sharded_ranks_give_the_losses_of_one_process(
    tmp_path, tiny_llama_dir, reference_dir, parallel, reference, lora, held
):
    config = _five_steps(tmp_path, tiny_llama_dir, reference_dir if reference == "path" else reference, lora)
    single = _single(tmp_path, config)
    sharded = replace(config, parallel=parallel, run=replace(config.run, output_dir=str(tmp_path / "two")))
    ranks = run_ranks(workers.dpo_losses_and_reference, 2, sharded, 5, timeout=240)
    assert [how for _, how in ranks] == [held, held]  # a separate reference is sharded, never whole
    _assert_equal(single, [losses for losses, _ in ranks])


@pytest.mark.parametrize("lora", [True, False], ids=["lora-auto", "full-auto"])
def test_two_deepspeed_zero2_ranks_give_the_losses_of_one_process(tmp_path, tiny_llama_dir, lora):
    """ZeRO-2 partitions gradients and optimizer state, not weights: the reference is the adapter
    disabled, or a whole frozen copy on each rank."""
    pytest.importorskip("deepspeed")
    config = _five_steps(tmp_path, tiny_llama_dir, lora=lora)
    single = _single(tmp_path, config)
    zero2 = replace(
        config,
        parallel=ParallelConfig(kind="deepspeed", zero_stage=2),
        run=replace(config.run, output_dir=str(tmp_path / "two")),
    )
    _assert_equal(single, run_ranks(workers.dpo_losses, 2, zero2, 5, timeout=240))
