"""Peak memory per rank while an FSDP2-sharded policy's weights go to a sampler: all at once
(`policy_weights`: every parameter gathered whole before the first is sent, the way weights went to
vLLM before they streamed) against streamed in buckets (`weight_buckets(stream_policy_weights(...))`:
one parameter gathered at a time, a bucket of them held until it is sent).

    python tools/bench_weight_sync.py [--hidden 512] [--layers 8] [--bucket-mb 16]

Runs 2 gloo processes on the CPU per mode (a fresh pair each, so one mode's peak cannot hide the
other's). Each rank reads its resident memory (/proc/self/statm) every millisecond during the sync
and reports the peak above what it held just before; "sent" is what a sampler would receive, summed
over the buckets (the same bytes either way). Prints one line per mode and rank.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


class PeakWatch:
    """The highest resident memory seen every millisecond between start and stop."""

    def __init__(self) -> None:
        self.peak, self.running = 0, False

    def __enter__(self) -> "PeakWatch":
        self.base = self.peak = resident_bytes()
        self.running = True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        while self.running:
            self.peak = max(self.peak, resident_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, resident_bytes())


def worker(rank: int, mode: str, hidden: int, layers: int, bucket_mb: int, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from ditty.objectives.sampling.policy_weights import policy_weights, stream_policy_weights, weight_buckets

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=259,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    whole_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    import gc

    gc.collect()
    dist.barrier()
    sent = 0
    with PeakWatch() as watch:
        if mode == "whole":
            weights = policy_weights(model, cpu=True)  # everything gathered before the first is sent
            sent = sum(t.numel() * t.element_size() for _, t in weights)
            del weights
        else:
            for bucket in weight_buckets(stream_policy_weights(model, cpu=True), bucket_mb << 20):
                sent += sum(t.numel() * t.element_size() for _, t in bucket)  # the sampler loads it here
                del bucket
    print(
        f"{mode:8s} rank {rank}: model {whole_bytes / 2**20:.1f} MiB, sent {sent / 2**20:.1f} MiB, "
        f"peak above the sharded policy {(watch.peak - watch.base) / 2**20:.1f} MiB",
        flush=True,
    )
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--bucket-mb", type=int, default=16)
    args = parser.parse_args()
    for index, mode in enumerate(("whole", f"streamed ({args.bucket_mb} MB buckets)")):
        kind = "whole" if index == 0 else "streamed"
        mp.spawn(worker, args=(kind, args.hidden, args.layers, args.bucket_mb, 29650 + index), nprocs=2, join=True)
        print(f"-- {mode}", flush=True)


if __name__ == "__main__":
    main()
