"""Tiny random causal LMs with MTP heads, and batches for them (tests/models/test_mtp*.py)."""

from __future__ import annotations

import torch

from ditty.config.mtp import MTPConfig

BASE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=16)
FAMILIES = {
    "llama": {},
    "mistral": dict(sliding_window=None),
    "qwen2": {},
    "qwen3": dict(head_dim=16),
    "qwen3_moe": dict(MOE, num_experts=4, head_dim=16),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "gemma": dict(head_dim=16),
    "granite": {},
    "olmo2": {},
    "phi3": {},
    "smollm3": {},
    "deepseek_v3": dict(
        MOE,
        n_routed_experts=4,
        n_shared_experts=1,
        first_k_dense_replace=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        n_group=1,
        topk_group=1,
    ),
    "glm4_moe": dict(MOE, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1),
}


def tiny_config(model_type: str, **overrides):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **{**BASE, **FAMILIES[model_type], **overrides})


def tiny_model(model_type: str = "llama", depth: int = 2, seed: int = 0, **overrides):
    """A random 2-layer model of `model_type` (seed `seed`) with `depth` fresh MTP heads attached."""
    from transformers import AutoModelForCausalLM

    from ditty.models.mtp.converter import MTPConverter

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides))
    return MTPConverter(depth).convert(model) if depth else model


def mtp_config(**fields) -> MTPConfig:
    return MTPConfig(**{"depth": 2, "weight": 0.3, **fields})


SAMPLES = [list(range(5, 12)), list(range(20, 25)), list(range(30, 41)), [50, 51, 52]]


def labelled(ids: list[int], prompt: int = 2) -> tuple[list[int], list[int]]:
    """A sample whose first `prompt` tokens take no loss (as a prompt's)."""
    return ids, [-100] * prompt + ids[prompt:]


def packed_batch(samples=SAMPLES) -> dict:
    """The samples packed into one row (ditty.data.collate.pack_rows), with a padding tail."""
    from ditty.data.collate import pack_rows

    return pack_rows([[labelled(s) for s in samples]], pad_token_id=0)


def padded_batch(samples=SAMPLES) -> dict:
    from ditty.data.collate import pad_samples

    return pad_samples([labelled(s) for s in samples], pad_token_id=0)
