"""The label id that carries no loss.

-100 is PyTorch's `cross_entropy` default `ignore_index`, which Hugging Face models and collators
follow; every producer of labels (formats, collators) and every consumer (losses, token counts)
reads it from here.
"""

IGNORE_INDEX = -100
