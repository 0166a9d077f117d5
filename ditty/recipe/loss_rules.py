"""Compiler rules for the chunked cross-entropy (`[train] loss_chunks`, `loss_backend`).

Registered after the core rules (imported by ditty/recipe/compiler.py). The backends' availability
and hardware are rows of the compatibility table (ditty/recipe/compatibility_rules.py: compat.liger-missing,
compat.cce-missing, compat.loss-kernel-cuda); here: where the chunked loss applies at all.
"""

from __future__ import annotations

from typing import Iterator

from ditty.config.errors import Problem
from ditty.recipe.rules import Context, error, rule, warning

HEAD_NAMES = ("lm_head", "embed_out")
"""Names of Hugging Face output heads a recipe may target with an adapter (gpt_neox: embed_out)."""


@rule("train.loss_chunks")
def chunked_loss_fits(ctx: Context) -> Iterator[Problem]:
    """loss_chunks applies to the default causal-LM loss of a Hugging Face model, with a head that
    can be taken apart into one projection (no DoRA, no LoRA dropout on it)."""
    cfg = ctx.config
    train = cfg.train
    if train.loss_chunks < 0:
        yield error("train.loss_chunks", f"must not be negative, got {train.loss_chunks}", "use 0 (full logits) or N")
        return
    if train.loss_chunks == 0:
        if ctx.is_set("train.loss_backend"):
            yield warning(
                "train.loss_backend",
                "has no effect because train.loss_chunks = 0 (the loss takes the full logits)",
                "set train.loss_chunks (e.g. 8) to compute the loss from the hidden states in chunks",
            )
        return
    fused = '"ditty.fused_loss:FusedLinearCrossEntropyLoss"'
    if cfg.pipeline.loss:
        yield warning(
            "train.loss_chunks",
            "has no effect: [[pipeline.loss]] replaces the causal-LM loss",
            f"use {fused} in [[pipeline.loss]] (kwargs chunks and backend), or remove train.loss_chunks",
        )
        return
    if cfg.model.factory:
        yield error(
            "train.loss_chunks",
            "a custom model (model.factory) has no Hugging Face output head to compute the chunked loss from",
            f"set train.loss_chunks = 0, or add [[pipeline.loss]] use = {fused} with hidden_index and "
            "weight_index (or weight_attr_path) naming the hidden states and the projection",
        )
        return
    task = getattr(cfg.model, "task", "causal-lm")
    if task != "causal-lm":
        yield error(
            "train.loss_chunks",
            f'applies to causal language models; model.task is "{task}"',
            "set train.loss_chunks = 0",
        )
        return
    yield from _adapter_on_head(cfg)
    if cfg.parallel.kind == "deepspeed" and cfg.parallel.zero_stage == 3:
        # Measured: the head's weight gradient reaches a parameter ZeRO-3 has partitioned again
        # ("size of tensor a (0) must match ... b (32)"); stage 2 keeps parameters whole and works.
        yield error(
            "train.loss_chunks",
            "the chunked loss reads the output head outside its forward, where DeepSpeed ZeRO-3 keeps its "
            "parameters partitioned",
            'use parallel.zero_stage = 2 or parallel.kind = "fsdp" (both tested with it), or train.loss_chunks = 0',
        )
    tokens = train.micro_batch_size * cfg.data.max_seq_len
    if train.loss_chunks > tokens:
        yield warning(
            "train.loss_chunks",
            f"{train.loss_chunks} chunks for at most {tokens} tokens per micro-batch (micro_batch_size x max_seq_len): "
            "chunks of one token waste the matrix products",
            f"use fewer chunks, e.g. {max(1, tokens // 1024)} (about 1,024 tokens each)",
        )
    try:
        from ditty.models import read_model_type
        from ditty.stages.fused_loss import VERIFIED_MODEL_TYPES
    except ImportError:
        return
    model_type = read_model_type(cfg.model)
    if model_type is not None and model_type not in VERIFIED_MODEL_TYPES:
        yield warning(
            "train.loss_chunks",
            f"the chunked loss is not verified for {model_type} models (it assumes the logits are the output "
            "head's projection, scaled or softcapped as cohere, granite and gemma do)",
            "compare a step's loss with train.loss_chunks = 0 before relying on it",
        )


def _adapter_on_head(cfg) -> Iterator[Problem]:
    peft = cfg.peft
    targets = [peft.target_modules] if isinstance(peft.target_modules, str) else list(peft.target_modules)
    if peft.kind == "none" or not any(name in HEAD_NAMES for name in targets):
        return  # "all-linear" leaves the output head out
    if peft.kind == "dora":
        yield error(
            "peft.target_modules",
            "DoRA on the output head cannot be merged into one projection for the chunked loss",
            "leave the head out of peft.target_modules (train it with modules_to_save), or train.loss_chunks = 0",
        )
    elif peft.dropout > 0:
        yield error(
            "peft.dropout",
            "LoRA dropout on the output head cannot be merged into one projection for the chunked loss",
            "set peft.dropout = 0, leave the head out of peft.target_modules, or train.loss_chunks = 0",
        )
