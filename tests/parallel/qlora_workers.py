"""Rank functions for the low-memory FSDP + QLoRA tests (importable by spawned processes)."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

QLORA = dict(quant=dict(kind="bnb-4bit", storage_dtype="float32"), peft=dict(kind="lora", r=8, alpha=16, dropout=0.0))


def _config(model_dir: str, out: str, *, steps: int = 3):
    from ditty.config import TrainerConfig
    from ditty.config.sections import (
        DataConfig,
        LoggingConfig,
        ModelConfig,
        OptimizerConfig,
        ParallelConfig,
        PeftConfig,
        QuantConfig,
        RunConfig,
        SchedulerConfig,
        TokenizerConfig,
        TrainConfig,
    )

    return TrainerConfig(
        run=RunConfig(name="qlora", output_dir=out, seed=0, device="cpu"),
        model=ModelConfig(path=model_dir, init="pretrained"),
        tokenizer=TokenizerConfig(kind="byte"),
        data=DataConfig(
            source="builtin",
            name="addition",
            format="prompt_completion",
            max_seq_len=32,
            num_samples=64,
            val_fraction=0.05,
        ),
        train=TrainConfig(
            steps=steps,
            global_batch_size=4,
            micro_batch_size=2,
            max_grad_norm=1.0,
            log_every=1,
            eval_every=0,
            eval_samples=2,
        ),
        optimizer=OptimizerConfig(lr=1e-2),
        scheduler=SchedulerConfig(kind="constant"),
        parallel=ParallelConfig(kind="fsdp"),
        quant=QuantConfig(**QLORA["quant"]),
        peft=PeftConfig(**QLORA["peft"]),
        logging=LoggingConfig(progress=False),
    )


class CheckpointReads:
    """Records every attempt of this process to open a file of `model_dir` (Python's open and os.open,
    through an audit hook) or to open a safetensors file (refused) until `stop()`. An open by the
    recipe compiler's header reader (ditty.models.source._safetensors_header, which reads the JSON
    header's few KB to compare the vocabulary with config.json) is recorded as "NAME (header)"."""

    def __init__(self, model_dir: str):
        import safetensors
        import safetensors.torch
        import transformers.modeling_utils  # binds `safe_open` at import: patched below as well

        self.model_dir = os.path.realpath(model_dir)
        self.reads: list[str] = []
        self.active = True
        sys.addaudithook(self._hook)  # cannot be removed: `active` turns it off
        self._saved = [
            (safetensors, "safe_open", safetensors.safe_open),
            (safetensors.torch, "safe_open", safetensors.torch.safe_open),
            (safetensors.torch, "load_file", safetensors.torch.load_file),
            (transformers.modeling_utils, "safe_open", transformers.modeling_utils.safe_open),
        ]

        def refuse(path, *args, **kwargs):
            self.reads.append(str(path))
            raise AssertionError(f"this rank opened the checkpoint {path}")

        for module, name, _ in self._saved:
            setattr(module, name, refuse)

    def _hook(self, event, args):
        if self.active and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if os.path.realpath(path).startswith(self.model_dir + os.sep):
                caller = sys._getframe(1)
                while caller is not None and caller.f_code.co_name != "_safetensors_header":
                    caller = caller.f_back
                self.reads.append(path + " (header)" if caller is not None else path)

    def stop(self) -> list[str]:
        self.active = False
        for module, name, original in self._saved:
            setattr(module, name, original)
        return list(self.reads)


def train_both_ways(rank: int, world: int, model_dir: str, out: str, steps: int = 3, bad_dir: str | None = None):
    """The same QLoRA recipe trained twice on fsdp: the low-memory build, then every rank building
    the whole quantized model; then (with `bad_dir`) the recipe on a damaged checkpoint.

    Returns whether the first run built on meta, the files of `model_dir` this rank opened during it
    (always recorded on rank != 0), and `bad_checkpoint`'s result (or None).
    """
    from ditty.models import meta
    from ditty.train import Trainer

    watch = CheckpointReads(model_dir) if rank != 0 else None
    low = Trainer(_config(model_dir, os.path.join(out, "low"), steps=steps))
    flag = low.built_on_meta
    low.train()
    reads = watch.stop() if watch else []
    build_low_memory = meta.build_low_memory
    meta.build_low_memory = lambda *a, **k: None  # the every-rank build
    try:
        Trainer(_config(model_dir, os.path.join(out, "every"), steps=steps)).train()
    finally:
        meta.build_low_memory = build_low_memory
    bad = bad_checkpoint(rank, world, bad_dir, os.path.join(out, "bad")) if bad_dir else None
    return flag, reads, bad


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _build_shard_load(rank: int, config, mode: str, mesh):
    """One way of building the sharded QLoRA model; returns it."""
    from ditty.models import build_model
    from ditty.models.adapters import LoraConverter
    from ditty.models.meta import build_quantized_on_meta
    from ditty.models.quant import share_4bit_quant_states
    from ditty.parallel.materialize import full_tensor_references, load_sharded_from_rank0_tensors
    from ditty.parallel.wrap import apply_parallelism

    device = torch.device("cpu")
    converter = LoraConverter(config.peft, upcast_quantized=False)
    if mode == "low":
        model = converter.convert(build_quantized_on_meta(config, None, device))
        full = full_tensor_references(model) if rank == 0 else None
        model = apply_parallelism(model, config.parallel, mesh, precision="fp32")
        load_sharded_from_rank0_tensors(model, full, device=device)
        share_4bit_quant_states(model, device)
        return model
    model = converter.convert(build_model(config.model, device=device, quant=config.quant))
    return apply_parallelism(model, config.parallel, mesh, precision="fp32")


def memory_both_ways(rank: int, world: int, model_dir: str, warmup_dir: str):
    """Peak resident memory above this rank's baseline while building the sharded QLoRA model: the
    low-memory build ("low"), then every rank building the whole quantized model ("every"), each
    from a fresh peak (VmHWM reset to the current RSS), then one forward + backward to prove the
    shards work. Rank != 0 records any open of the checkpoint during the low-memory build. Both ways
    first run once on the tiny `warmup_dir` model, so lazy imports and first-use allocations of
    transformers, peft and bitsandbytes are in the baseline, not in the first figure measured."""
    import gc

    from ditty.parallel.allocator import return_freed_memory_to_os
    from ditty.parallel.env import init_distributed
    from ditty.parallel.memory import local_nbytes, peak_rss_bytes, reset_peak_rss
    from ditty.parallel.mesh import build_mesh

    assert return_freed_memory_to_os()  # freed tensors leave RSS, so the second build starts clean
    config = _config(model_dir, "/nonexistent")
    mesh = build_mesh(config.parallel, init_distributed("cpu"))
    tokens = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(rank))
    for mode in ("low", "every"):
        warm = _build_shard_load(rank, _config(warmup_dir, "/nonexistent"), mode, mesh)
        warm(input_ids=tokens, labels=tokens).loss.backward()
        del warm
    out = {}
    for mode in ("low", "every"):
        watch = CheckpointReads(model_dir) if rank != 0 and mode == "low" else None
        gc.collect()
        dist.barrier()
        assert reset_peak_rss()
        baseline = _rss()
        model = _build_shard_load(rank, config, mode, mesh)
        built = peak_rss_bytes() - baseline
        reads = watch.stop() if watch else []
        local = sum(local_nbytes(p) for p in model.parameters())
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        out[mode] = {"peak_build": built, "local_param_bytes": local, "loss": float(loss.detach()), "reads": reads}
        del model, loss
        gc.collect()
        dist.barrier()
    return out


def bad_checkpoint(rank: int, world: int, model_dir: str, out: str):
    """Build the Trainer of a QLoRA recipe whose checkpoint is damaged; returns (error type, message,
    seconds until the error) on every rank."""
    import time

    from ditty.config.errors import RecipeError
    from ditty.train import Trainer

    started = time.monotonic()
    try:
        Trainer(_config(model_dir, out))
    except RecipeError as error:
        return type(error).__name__, error.format(), time.monotonic() - started
    return None, "no error", time.monotonic() - started
