"""Real torch.distributed on CPU (gloo): 1 process and N processes agree on the same global batch.

Slow tier: each test spawns ranks that import torch (seconds each on a shared 2-core machine).
"""

from __future__ import annotations

import pytest
import torch

from tests.parallel import workers
from tests.parallel.harness import relative_error, run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference():
    """One process, no torch.distributed, accumulation 1: the ground truth."""
    return workers.train(0, 1, {"kind": "none"}, 4, 1)


def _check(results, reference):
    ref_losses, ref_weights, ref_grads, _ = reference
    for losses, weights, grads, _ in results:
        assert relative_error(grads, ref_grads) < TOLERANCE
        assert relative_error(weights, ref_weights) < TOLERANCE
        assert losses == pytest.approx(ref_losses, rel=TOLERANCE)


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_two_ranks_match_one_process_with_accumulation(kind, reference):
    # 2 ranks x 2 micro-batches of 2 = the reference's global batch of 8; gradients reduce only on
    # the last micro-batch, and grad_average_correction undoes the mean over ranks.
    results = run_ranks(workers.train, 2, {"kind": kind}, 4, 2, timeout=180)
    assert results[0][3] == ("DistributedDataParallel" if kind == "ddp" else "FSDPTinyNet")
    _check(results, reference)


def test_fsdp_sync_every_micro_batch_and_cpu_offload_without_pinning(reference):
    # The offload code path on a CPU device (pinning forced off there, with a warning).
    results = run_ranks(
        workers.train,
        2,
        {
            "kind": "fsdp",
            "sync_grad_accum": True,
            "cpu_offload": True,
            "pin_memory": True,
            "reshard_after_forward": False,
        },
        4,
        2,
        timeout=180,
    )
    _check(results, reference)


def test_hsdp_two_by_two_matches_one_process(reference):
    results = run_ranks(workers.train, 4, {"kind": "hsdp", "replicate_size": 2}, 4, 1, timeout=240)
    _check(results, reference)


@pytest.mark.parametrize("how", ["safetensors", "rank0_state_dict"])
def test_meta_build_then_each_rank_loads_its_shard(how, tiny_llama_dir):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    results = run_ranks(workers.load_sharded, 2, tiny_llama_dir, how, timeout=240)
    expected = load_file(f"{tiny_llama_dir}/model.safetensors")
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    with torch.no_grad():
        ref_logits = reference(torch.arange(10)[None, :]).logits
    for weights, logits, _local in results:
        for name, value in expected.items():
            assert torch.equal(weights[name], value), name
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    # Each rank holds half of every 2-D weight's rows (the 64-wide ones split 32 / 32).
    assert results[0][2]["model.layers.0.self_attn.q_proj.weight"] == torch.Size([32, 64])
