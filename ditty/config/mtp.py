"""`[mtp]`: multi-token prediction heads trained beside a causal LM (DeepSeek-V3's MTP modules).

Depth k (1 to `depth`) is one module: the trunk's hidden state (for k > 1, depth k - 1's) and the
embedding of the token k ahead, each RMS-normalised, concatenated, projected back to the hidden size
and passed through one transformer block of the model's own family; the model's output head scores
it against the token k + 1 ahead. The loss is the row's own plus `weight` times the mean over depths
of their cross-entropies (Megatron-LM's `mtp_loss_scaling_factor`, torchtitan's MTP weight), each a
mean over its own supervised tokens of the whole global batch. The heads are saved in final/, and
`ditty generate --speculative mtp` decodes with them as drafts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MTPConfig:
    depth: int = 0
    """How many tokens ahead the heads predict (one module per depth); 0 trains none. Applies to the
    causal LM's supervised training and to on-policy distillation (`[distill] kind = "gkd"`)."""
    weight: float = 0.1
    """Weight of the heads' mean cross-entropy beside the main loss (Megatron-LM's default 0.1;
    DeepSeek-V3 pretrained at 0.3, then 0.1). 0 trains nothing through the heads."""
    decay: float = 1.0
    """Depth k's share of that mean is proportional to decay^(k-1), normalised to sum to 1: 1.0 weighs
    every depth alike (weight / depth each); below 1 favours the nearer tokens, which drafts need most."""
    trunk_gradient: bool = True
    """Whether the heads' loss reaches the trunk (its hidden states, the shared embedding and output
    head) as in DeepSeek-V3; false trains the heads alone on detached trunk outputs, leaving the main
    model's training exactly as without them."""
