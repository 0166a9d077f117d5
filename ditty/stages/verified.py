"""The causal-LM model types ditty has verified, one table for every feature that depends on the
architecture: packed samples stay isolated under the block-diagonal mask (ditty/models/packing.py,
PACKED_MASK_MODEL_TYPES; checked by tests/models/test_packing.py), and the chunked loss and its
gradients match the full-logits loss, because the logits are the output head's projection, at most
scaled or softcapped (ditty/stages/fused_loss; checked by tests/stages/test_fused_loss.py). Each test runs a
2-layer, 64-wide random model of every type here, so a type added here is checked for both.

Importing this module is cheap (no torch): the recipe compiler reads it.
"""

VERIFIED_MODEL_TYPES = frozenset(
    {
        "cohere",
        "exaone4",
        "falcon",
        "gemma",
        "gemma2",
        "gemma3_text",
        "glm",
        "gpt2",
        "gpt_bigcode",
        "gpt_neox",
        "granite",
        "granitemoe",
        "llama",
        "llama4_text",
        "mistral",
        "mixtral",
        "olmo",
        "olmo2",
        "olmoe",
        "opt",
        "phi",
        "phi3",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "smollm3",
        "stablelm",
        "starcoder2",
    }
)
