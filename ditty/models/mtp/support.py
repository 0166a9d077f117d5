"""Which causal LMs take multi-token prediction heads, read by the recipe compiler (cheap: no torch).

ditty builds each depth from transformers' own `MtpLayer` (transformers.modeling_layers) around one
decoder block of the model's family, and feeds it the keyword arguments the trunk's last block was
called with (its attention mask, or the packed samples' lengths, and its rotary embeddings), so the
heads attend exactly as the trunk does. tests/models/test_mtp_families.py builds a 2-layer random
model of every type listed here and checks that a packed row's heads equal its samples run alone,
and that the heads train.
"""

from __future__ import annotations

NATIVE_MTP_TYPES = frozenset({"deepseek_v3", "glm4_moe"})
"""Architectures whose published checkpoints ship MTP layers as `model.layers.{L + k}.*` (L trunk
layers; transformers' config field `num_mtp_layers`, on disk `num_nextn_predict_layers`): ditty builds
their depths as transformers' `MtpModel` does, loads the checkpoint's MTP weights into them and saves
them back under the same names, beside the trunk's."""

MTP_MODEL_TYPES = NATIVE_MTP_TYPES | frozenset(
    {
        "gemma",
        "granite",
        "llama",
        "mistral",
        "mixtral",
        "olmo2",
        "phi3",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "smollm3",
    }
)
"""Model types verified to train MTP heads (see the module doc)."""
