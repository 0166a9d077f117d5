"""Policy losses: a micro-batch's token log-probabilities and advantages -> its share of the loss.

A policy loss is a function called as

    fn(logps, old_logps, advantages, mask, *, global_sequences, global_tokens, reference_logps, beta,
       clip_low, clip_high, importance, max_new_tokens, token_weights) -> ObjectiveOutput

on each micro-batch (ditty.objectives.rl.grpo.grpo_loss documents every argument), returning the
micro-batch's SHARE of the loss over the whole global batch (its sum over whatever the loss averages,
divided by the global count: `global_tokens` or `global_sequences`) and its metrics' shares, so that
any split of a global batch gives the same loss and gradients (ditty.objectives.output.share).
`rl.loss` names one of `POLICY_LOSSES` or a function of one's own as "package.module:function" (the
compiler imports and checks it before any weight loads; ditty.rl.PolicyLoss is the interface).

| name | the clipped surrogate (and k3 KL), averaged |
|---|---|
| "grpo" | per sequence over its tokens, then over the sequences |
| "dapo" | over every token of the global batch |
| "dr_grpo" | the token sum over sequences x rollout.max_new_tokens |
"""

from __future__ import annotations

import functools
from typing import Any, Callable

POLICY_LOSSES = ("grpo", "dapo", "dr_grpo")
"""The built-in normalisations of ditty.objectives.rl.grpo.grpo_loss."""


def policy_loss_for(rl: Any) -> Callable[..., Any]:
    """The policy loss `rl.loss` names: grpo_loss with a built-in normalisation, or the user's function."""
    if rl.loss in POLICY_LOSSES:
        from ditty.objectives.rl.grpo import grpo_loss

        return functools.partial(grpo_loss, loss=rl.loss)
    from ditty.config.references import import_reference

    return import_reference(rl.loss, key="rl.loss")


def describe(loss: str) -> str:
    """The plan's and the card's words for `rl.loss`."""
    return f"{loss} loss" if loss in POLICY_LOSSES else f"policy loss {loss} (your own)"
