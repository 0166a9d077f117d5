"""2 DDP ranks (real gloo processes) give the losses of 1 process over 5 DPO steps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ditty.config.sections import ParallelConfig, PeftConfig
from tests.parallel.harness import run_ranks
from tests.preference import workers
from tests.preference.test_loss import _config


@pytest.mark.slow
def test_two_ddp_ranks_give_the_losses_of_one_process(tmp_path, tiny_llama_dir):
    config = replace(_config(tmp_path, tiny_llama_dir, "dpo"), peft=PeftConfig(kind="lora", r=4, alpha=8))
    config = replace(config, train=replace(config.train, steps=5, global_batch_size=4, micro_batch_size=1))
    single = workers.dpo_losses(0, 1, replace(config, run=replace(config.run, output_dir=str(tmp_path / "one"))), 5)
    ddp = replace(
        config, parallel=ParallelConfig(kind="ddp"), run=replace(config.run, output_dir=str(tmp_path / "two"))
    )
    ranks = run_ranks(workers.dpo_losses, 2, ddp, 5, timeout=240)
    assert ranks[0] == ranks[1]
    assert len(set(single)) > 1  # it trains
    for one, two in zip(single, ranks[0]):
        assert two == pytest.approx(one, abs=1e-6)
