"""The label id that carries no loss.

-100 is PyTorch's `cross_entropy` default `ignore_index`, which Hugging Face models and collators
follow; every producer of labels (formats, collators) and every consumer (losses, token counts)
reads it from here.
"""

IGNORE_INDEX = -100

SHIFTED_LABELS = "shift_labels"
"""Batch key of labels already shifted (position t scored on label t + 1), under transformers' name:
a context-parallel rank's slice of a row (ditty.data.context_shard) carries these instead of
`labels`, since the next token of its last position lies in the next rank's slice."""
