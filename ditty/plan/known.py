"""Public configs of well-known models, for planning a hub id that is not in the local cache.

Only the config.json fields the planner reads, copied from each model's public config.json on the
Hugging Face Hub. Used only when the id names neither a local directory nor a cached model: a
cached config.json always wins (it may differ, e.g. a resized vocabulary). `PUBLISHED_PARAMETERS`
holds each model's published parameter count, which tests/plan checks the inventory against.
"""

from __future__ import annotations

from typing import Any, Optional

_LLAMA3_8B = dict(
    model_type="llama",
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)
_LLAMA3_70B = dict(_LLAMA3_8B, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64)
_LLAMA32 = dict(_LLAMA3_8B, intermediate_size=8192, tie_word_embeddings=True)
_MISTRAL_7B = dict(
    model_type="mistral",
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)
_QWEN25 = dict(model_type="qwen2", torch_dtype="bfloat16", tie_word_embeddings=False, vocab_size=152064)
_QWEN25_SMALL = dict(_QWEN25, tie_word_embeddings=True, vocab_size=151936)
_GEMMA = dict(model_type="gemma", vocab_size=256000, head_dim=256, tie_word_embeddings=True, torch_dtype="bfloat16")
_GEMMA2 = dict(_GEMMA, model_type="gemma2", torch_dtype="float32")
_LLAMA1 = dict(
    model_type="llama",
    vocab_size=32000,
    tie_word_embeddings=False,
    torch_dtype="float16",
)

_CONFIGS: dict[str, dict[str, Any]] = {
    # Llama 3 / 3.1 / 3.3 (the 3.1 configs differ from 3's in rope scaling and context length only)
    "meta-llama/Meta-Llama-3-8B": _LLAMA3_8B,
    "meta-llama/Meta-Llama-3-8B-Instruct": _LLAMA3_8B,
    "meta-llama/Llama-3.1-8B": _LLAMA3_8B,
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA3_8B,
    "meta-llama/Meta-Llama-3.1-8B": _LLAMA3_8B,
    "meta-llama/Meta-Llama-3.1-8B-Instruct": _LLAMA3_8B,
    "meta-llama/Meta-Llama-3-70B": _LLAMA3_70B,
    "meta-llama/Meta-Llama-3-70B-Instruct": _LLAMA3_70B,
    "meta-llama/Llama-3.1-70B": _LLAMA3_70B,
    "meta-llama/Llama-3.1-70B-Instruct": _LLAMA3_70B,
    "meta-llama/Meta-Llama-3.1-70B": _LLAMA3_70B,
    "meta-llama/Meta-Llama-3.1-70B-Instruct": _LLAMA3_70B,
    "meta-llama/Llama-3.3-70B-Instruct": _LLAMA3_70B,
    # Llama 3.2 text models: tied embeddings
    "meta-llama/Llama-3.2-1B": dict(_LLAMA32, hidden_size=2048, num_hidden_layers=16, head_dim=64),
    "meta-llama/Llama-3.2-1B-Instruct": dict(_LLAMA32, hidden_size=2048, num_hidden_layers=16, head_dim=64),
    "meta-llama/Llama-3.2-3B": dict(_LLAMA32, hidden_size=3072, num_hidden_layers=28, num_attention_heads=24),
    "meta-llama/Llama-3.2-3B-Instruct": dict(_LLAMA32, hidden_size=3072, num_hidden_layers=28, num_attention_heads=24),
    # Mistral 7B
    "mistralai/Mistral-7B-v0.1": _MISTRAL_7B,
    "mistralai/Mistral-7B-Instruct-v0.1": _MISTRAL_7B,
    "mistralai/Mistral-7B-Instruct-v0.2": _MISTRAL_7B,
    "mistralai/Mistral-7B-v0.3": dict(_MISTRAL_7B, vocab_size=32768),
    "mistralai/Mistral-7B-Instruct-v0.3": dict(_MISTRAL_7B, vocab_size=32768),
    # Qwen 2.5 (q/k/v carry biases)
    "Qwen/Qwen2.5-0.5B": dict(
        _QWEN25_SMALL,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "Qwen/Qwen2.5-1.5B": dict(
        _QWEN25_SMALL,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
    "Qwen/Qwen2.5-3B": dict(
        _QWEN25_SMALL,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
    ),
    "Qwen/Qwen2.5-7B": dict(
        _QWEN25,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
    ),
    "Qwen/Qwen2.5-14B": dict(
        _QWEN25,
        hidden_size=5120,
        intermediate_size=13824,
        num_hidden_layers=48,
        num_attention_heads=40,
        num_key_value_heads=8,
    ),
    "Qwen/Qwen2.5-32B": dict(
        _QWEN25,
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
    ),
    "Qwen/Qwen2.5-72B": dict(
        _QWEN25,
        hidden_size=8192,
        intermediate_size=29568,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
    ),
    # Gemma and Gemma 2 (head_dim is not hidden / heads; embeddings tied)
    "google/gemma-2b": dict(
        _GEMMA,
        hidden_size=2048,
        intermediate_size=16384,
        num_hidden_layers=18,
        num_attention_heads=8,
        num_key_value_heads=1,
    ),
    "google/gemma-7b": dict(
        _GEMMA,
        hidden_size=3072,
        intermediate_size=24576,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=16,
    ),
    "google/gemma-2-2b": dict(
        _GEMMA2,
        hidden_size=2304,
        intermediate_size=9216,
        num_hidden_layers=26,
        num_attention_heads=8,
        num_key_value_heads=4,
    ),
    "google/gemma-2-9b": dict(
        _GEMMA2,
        hidden_size=3584,
        intermediate_size=14336,
        num_hidden_layers=42,
        num_attention_heads=16,
        num_key_value_heads=8,
    ),
    "google/gemma-2-27b": dict(
        _GEMMA2,
        hidden_size=4608,
        intermediate_size=36864,
        num_hidden_layers=46,
        num_attention_heads=32,
        num_key_value_heads=16,
        head_dim=128,
    ),
    # The original LLaMA, as the QLoRA paper finetuned it
    "huggyllama/llama-7b": dict(
        _LLAMA1, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32
    ),
    "huggyllama/llama-65b": dict(
        _LLAMA1, hidden_size=8192, intermediate_size=22016, num_hidden_layers=80, num_attention_heads=64
    ),
}

# Parameter counts as the model cards give them (billions, rounded as published).
PUBLISHED_PARAMETERS: dict[str, float] = {
    "meta-llama/Meta-Llama-3-8B": 8.03,
    "meta-llama/Llama-3.1-70B": 70.6,
    "meta-llama/Llama-3.2-1B": 1.24,
    "meta-llama/Llama-3.2-3B": 3.21,
    "mistralai/Mistral-7B-v0.1": 7.24,
    "Qwen/Qwen2.5-0.5B": 0.494,
    "Qwen/Qwen2.5-1.5B": 1.54,
    "Qwen/Qwen2.5-3B": 3.09,
    "Qwen/Qwen2.5-7B": 7.62,
    "Qwen/Qwen2.5-14B": 14.8,
    "Qwen/Qwen2.5-32B": 32.8,
    "Qwen/Qwen2.5-72B": 72.7,
    "google/gemma-2b": 2.51,
    "google/gemma-7b": 8.54,
    "google/gemma-2-2b": 2.61,
    "google/gemma-2-9b": 9.24,
    "google/gemma-2-27b": 27.2,
    "huggyllama/llama-65b": 65.3,
}


def known_config(model_id: str) -> Optional[dict[str, Any]]:
    """The public config of a well-known hub id (case-sensitive, as the Hub spells it), or None."""
    config = _CONFIGS.get(model_id)
    return dict(config) if config is not None else None


def known_ids() -> list[str]:
    return sorted(_CONFIGS)
