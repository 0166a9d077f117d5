"""`[preference]`: preference optimisation (the DPO family) on `data.format = "preference"` pairs, or
KTO on `"unpaired_preference"` examples. Defaults are TRL's (DPOConfig, CPOConfig, KTOConfig)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PreferenceKind = Literal["dpo", "ipo", "simpo", "orpo", "kto"]
REFERENCE_FREE = ("simpo", "orpo")
"""Kinds whose loss reads no reference model."""


@dataclass(frozen=True)
class PreferenceConfig:
    """How preference data trains a causal LM: the loss, its knobs and the reference model.

    Applies when `data.format` is "preference" (dpo, ipo, simpo, orpo) or "unpaired_preference" (kto)."""

    kind: PreferenceKind = "dpo"
    """The loss: "dpo" (Rafailov et al. 2023), "ipo" (Azar et al. 2023), "simpo" (Meng et al. 2024,
    reference-free), "orpo" (Hong et al. 2024, reference-free) or "kto" (Ethayarajh et al. 2024, on
    unpaired examples)."""
    beta: float = 0.1
    """The strength of the preference: DPO's and SimPO's beta, IPO's tau, ORPO's lambda, KTO's beta."""
    label_smoothing: float = 0.0
    """DPO and SimPO: the probability that a pair's preference is flipped (conservative DPO), in [0, 0.5)."""
    gamma: float = 0.5
    """SimPO: the target reward margin (TRL's simpo_gamma)."""
    desirable_weight: float = 1.0
    """KTO: the weight of desirable (label = true) examples."""
    undesirable_weight: float = 1.0
    """KTO: the weight of undesirable (label = false) examples."""
    sft_weight: float = 0.0
    """DPO and IPO: weight of an added NLL of the chosen completion (mean over its tokens, per pair),
    which keeps DPO from lowering the chosen answer's probability together with the rejected one
    (TRL's rpo_alpha; Pang et al. 2024). 0 is plain DPO."""
    reference: str = "auto"
    """The reference model: "auto" (with an adapter, the model with the adapter disabled, no second
    copy; a full finetune, a frozen copy of the starting weights), "precompute" (its log-probabilities
    computed once before training and kept in the run directory), or a model path / hub id.
    SimPO and ORPO take none."""
    pairs: Literal["offline", "online"] = "offline"
    """Where the pairs come from: "offline" reads them from the data (data.format = "preference");
    "online" samples them from the current policy every `refresh_every` steps: `rl.group_size`
    completions of each prompt (data.format = "prompt", the [rl] sampler settings), scored by
    `rl.rewards`, the best and the worst of each group (ties dropped) becoming a pair."""
    refresh_every: int = 1
    """With pairs = "online": optimizer steps between two samplings of new pairs from the policy."""
    chunks: int = 8
    """Completion tokens go through the output head in this many chunks (no full logits are made)."""
