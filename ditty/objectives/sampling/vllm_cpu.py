"""What vLLM's CPU engine needs before it starts: a KV cache sized for one step's rollouts (it allocates
the whole cache at start) and a head size its CPU attention has a kernel for. Read from a Hugging Face
config; used by the in-process engine (ditty.objectives.sampling.vllm_sampler) and the rollout server's
command line (ditty.cli.rollout_server)."""

from __future__ import annotations

import math
from typing import Any

import torch

BLOCK_TOKENS = 128
"""Rounding of each sequence's KV cache when sizing it on a CPU (vLLM allocates it in blocks)."""


def attention_shape(config: Any) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of a Hugging Face config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return text.num_hidden_layers, heads, head_dim


def refuse_unsupported_head_size(config: Any) -> None:
    """vLLM's CPU attention has kernels for some head sizes only; another fails at the first sample,
    deep inside the engine: say so before it starts (exit 2)."""
    from ditty.config.errors import RecipeError

    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):  # another vLLM: let the engine decide
        return
    head_dim = attention_shape(config)[2]
    if head_dim not in sizes:
        raise RecipeError.single(
            key="rollout.backend",
            message=f"vLLM's CPU attention has no kernel for this model's head size {head_dim} (it has {sizes})",
            fix='use rollout.backend = "generate" for this model, or a model whose hidden_size / '
            "num_attention_heads is one of those",
        )


def cpu_kv_bytes(config: Any, sequences: int, max_model_len: int, dtype: torch.dtype, rollout: Any) -> int:
    """The KV cache one step's rollouts need on a CPU (keys and values of every layer for `sequences`
    sequences of `max_model_len` tokens, each rounded up to whole blocks, twice over for vLLM's own
    scheduling slack), at most rollout.vllm_memory of the machine's memory."""
    import psutil

    layers, heads, head_dim = attention_shape(config)
    tokens = math.ceil(max_model_len / BLOCK_TOKENS) * BLOCK_TOKENS
    needed = 2 * sequences * tokens * layers * 2 * heads * head_dim * torch.finfo(dtype).bits // 8
    return int(min(max(needed, 16 * 2**20), rollout.vllm_memory * psutil.virtual_memory().total))
