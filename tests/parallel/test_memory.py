"""Memory that really shrinks (issue 6, item 7): a ~105M-parameter Llama on 1 process vs 2 (fsdp).

Per-rank parameter + optimizer bytes (from the local shards) must be <= 0.55 of one process, and
per-rank peak resident memory above the after-import baseline <= 2/3 (max over ranks; why not less:
at the assertion). Each run uses
ditty's default host allocator policy: glibc's defaults on one process, a fixed 2 MB mmap threshold
on several CPU processes, in torch's huge pages as ditty's launcher starts them
(`workers.memory_run` applies it as the trainer does; see
`ditty.parallel.allocator` for why and what it costs). The same
run with every rank building the whole model first peaks as high once training runs on 2 ranks
(AdamW state outweighs one full copy of the weights), but its load phase holds the whole model on
every rank; the meta-device path keeps that phase near one shard, which is what matters on more
ranks, where the training state per rank shrinks below one full model.
Run it alone to see the figures: `pytest tests/parallel/test_memory.py -s`.
"""

from __future__ import annotations

import pytest

from tests.parallel import workers
from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

MB = 2**20


@pytest.fixture(scope="module")
def llama_100m(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-100m")
    return str(path), workers.save_llama_105m(str(path))


def _summary(name, results):
    peak = max(r["peak_above_baseline"] for r in results)
    state = max(r["param_bytes"] + r["optimizer_bytes"] for r in results)
    after_load = max(r["peak_after_load"] for r in results)
    cpu = max(max(r["step_cpu_seconds"]) for r in results)
    faults = [max(r["step_page_faults"][i] for r in results) for i in range(len(results[0]["losses"]))]
    print(
        f"\n{name}: peak RSS above baseline {peak / MB:.0f} MB (after load {after_load / MB:.0f} MB), "
        f"params+optimizer {state / MB:.0f} MB, baseline RSS {results[0]['baseline_rss'] / MB:.0f} MB, "
        f"CPU s/step (max) {cpu:.1f}, page faults/step {faults}, "
        f"losses {results[0]['losses']}"
    )
    return peak, state


def test_fsdp_on_two_ranks_shrinks_state_and_peak_memory(llama_100m, monkeypatch, no_allocator_settings):
    model_dir, parameters = llama_100m
    assert 100e6 < parameters < 110e6
    one = run_ranks(workers.memory_run, 1, model_dir, "sharded", timeout=600, fresh_interpreters=True)
    # what `ditty run --nproc-per-node 2` gives the workers of an fsdp CPU run (torch's huge pages)
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    two = run_ranks(workers.memory_run, 2, model_dir, "sharded", timeout=600, fresh_interpreters=True)
    naive = run_ranks(workers.memory_run, 2, model_dir, "naive", timeout=600, fresh_interpreters=True)
    peak1, state1 = _summary("1 process", one)
    peak2, state2 = _summary("2 ranks, meta build + sharded load", two)
    peak_naive, state_naive = _summary("2 ranks, full build then shard", naive)
    print(
        f"ratios (2 ranks / 1 process): params+optimizer {state2 / state1:.3f}, peak RSS {peak2 / peak1:.3f}; "
        f"full-build-then-shard: params+optimizer {state_naive / state1:.3f}, peak RSS {peak_naive / peak1:.3f}"
    )
    assert state1 == pytest.approx(3 * 4 * parameters, rel=1e-5)  # fp32 weights, two moments (+ step counters)
    assert state2 / state1 <= 0.55
    # The parameter and optimizer bytes are exact; peak RSS is not. Two ranks in torch's huge pages
    # (THP_MEM_ALLOC_ENABLE) peak at what the kernel grants them, which depends on how fragmented other
    # jobs leave memory (THP in madvise mode): 0.554-0.578 here alone and beside a 2-process training
    # run, and past 0.6 once beside the whole suite. Two thirds still shows the peak shrink by a third.
    assert peak2 / peak1 <= 2 / 3
    load_sharded = max(r["peak_after_load"] for r in two)
    load_naive = max(r["peak_after_load"] for r in naive)
    print(f"load phase: meta build + sharded load {load_sharded / MB:.0f} MB, full build {load_naive / MB:.0f} MB")
    assert load_sharded <= 0.7 * load_naive
    # Each rank's loss is the mean over its half (equal token counts): their average is the global loss.
    two_ranks = [(a + b) / 2 for a, b in zip(two[0]["losses"], two[1]["losses"])]
    assert two_ranks == pytest.approx(one[0]["losses"], rel=1e-4)
