"""Which models can train on packed rows: several samples in one row, kept apart by the mask.

ditty's packed rows carry a 4D additive float mask [B, 1, T, T] (block-diagonal causal, 0 = attend,
finfo(float32).min = blocked) and position ids that restart per sample (see ditty/data/collate.py).
A model qualifies when its attention takes that mask as is.

How the table was verified (transformers 5.23, torch 2.13 CPU): for each model type a 2-layer,
64-wide random model ran one row of three packed samples (lengths 5, 7, 4) with the mask and
restarting position ids, under both "sdpa" and "eager"; its logits matched the samples run one by
one to within 6e-7. The same check with position ids alone leaked for falcon and opt (logits off by
0.4 and 0.2), and bloom (ALiBi) rejected the 4D mask outright. gemma2 has no sdpa path, only eager.
tests/models/test_packing.py repeats the check for every entry, so a transformers upgrade that
breaks one shows up as a failing test rather than as silently contaminated training.
"""

from __future__ import annotations

from typing import Any, Optional

PACKED_MASK_MODEL_TYPES = frozenset(
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

# Flash-attention kernels take no 4D mask (they isolate samples through position ids / cu_seqlens,
# a different data contract); the default (None) is sdpa.
MASK_TAKING_ATTENTION = (None, "sdpa", "eager")


def supports_packed_attention(model_or_config: Any, *, max_seq_len: Optional[int] = None) -> bool:
    """Whether packed rows (4D block-diagonal mask + restarting position ids) stay isolated.

    Takes a model (anything with `.config`, PEFT wrappers included), a transformers config, or a
    `model_type` string (what the recipe compiler knows without building anything). With a config,
    the attention kernel is checked too, and a sliding window shorter than `max_seq_len` makes the
    answer False: the explicit 4D mask replaces the model's own sliding-window mask (measured on
    mistral with sliding_window = 3: packed logits off by 0.3), so longer rows would attend further
    back than the model was built for.
    """
    if isinstance(model_or_config, str):
        return model_or_config in PACKED_MASK_MODEL_TYPES
    config = getattr(model_or_config, "config", model_or_config)
    if getattr(config, "model_type", None) not in PACKED_MASK_MODEL_TYPES:
        return False
    if getattr(config, "_attn_implementation", None) not in MASK_TAKING_ATTENTION:
        return False
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:  # qwen2 keeps a window it does not use
        window = None
    return not (window and max_seq_len and max_seq_len > window)
