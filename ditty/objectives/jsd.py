"""The generalised Jensen-Shannon divergence of a student's next-token distributions from a teacher's
(GKD, Agarwal et al. 2024; TRL's `generalized_jsd_loss`), with interpolation `beta`:

    JSD_beta(P_teacher || P_student) = beta KL(P_teacher || M) + (1 - beta) KL(P_student || M),
    M = beta P_teacher + (1 - beta) P_student,

the forward KL(teacher || student) at beta = 0 and the reverse KL(student || teacher) at beta = 1,
both distributions at one temperature.

Memory: the divergence is summed over the scored tokens in chunks, each chunk's logits of both models
made from their hidden states (the output heads' inputs) and recomputed in the backward
(`torch.utils.checkpoint`), so no [batch, length, vocab] logits of either model exist at once. The
distillation row that trains on it: ditty.objectives.gkd.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple, Optional

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ditty._utils.labels import IGNORE_INDEX
from ditty.objectives.jsd_shards import VocabGroup, copy_to_group, log_softmax, max_over_group, pick, sum_over_group
from ditty.stages.fused_loss import Projection, shifted
from ditty.stages.vocab_parallel import tensor_parallel_rows


def jsd_per_token(
    student_logits: Tensor,
    teacher_logits: Tensor,
    beta: float,
    temperature: float = 1.0,
    shard: Optional[VocabGroup] = None,
) -> Tensor:
    """The generalised JSD of every row of [tokens, vocab] logits, as TRL's generalized_jsd_loss computes
    it before reducing (in fp32; fp64 for fp64 logits, the exact checks). With `shard`, the logits are
    this rank's columns of the vocabulary (ditty.objectives.jsd_shards) and every rank gets the whole JSD."""
    dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32
    student = log_softmax(student_logits.to(dtype) / temperature, shard)
    teacher = log_softmax(teacher_logits.to(dtype) / temperature, shard)
    if beta == 0:
        return _kl(teacher, student, shard)
    if beta == 1:
        return _kl(student, teacher, shard)
    mixture = torch.logsumexp(torch.stack([student + math.log(1 - beta), teacher + math.log(beta)]), dim=0)
    return beta * _kl(teacher, mixture, shard) + (1 - beta) * _kl(student, mixture, shard)


def _kl(p_log: Tensor, q_log: Tensor, shard: Optional[VocabGroup] = None) -> Tensor:
    """KL(P || Q) per row, from log-probabilities (this rank's columns of them, with `shard`)."""
    return sum_over_group((p_log.exp() * (p_log - q_log)).sum(-1), shard)


class DistillSums(NamedTuple):
    """A micro-batch's sums over its scored tokens (`chunked_jsd`)."""

    divergence: Tensor
    """The generalised JSD summed over the scored tokens (the cross-entropy instead at the teacher's
    mistakes not followed)."""
    cross_entropy: Tensor
    """The student's cross-entropy on the data rows' tokens (0 unless asked for)."""
    tokens: Tensor
    """How many tokens are scored."""
    corrected: Tensor
    """How many data tokens learned the data's token instead of the teacher's distribution."""


def chunked_jsd(
    student_hidden: Tensor,
    student_head: Projection,
    teacher_hidden: Tensor,
    teacher_head: Projection,
    labels: Tensor,
    *,
    beta: float,
    temperature: float = 1.0,
    chunks: int = 8,
    data_rows: Optional[Tensor] = None,
    cross_entropy: bool = False,
    follow_teacher_mistakes: bool = True,
    aligned: bool = False,
) -> DistillSums:
    """The divergence of the student from the teacher, summed over the scored tokens. `labels` [B, T]
    follow Hugging Face's convention (position t's hidden state predicts label t + 1); hidden states
    are the output heads' inputs [B, T, H]. `data_rows` [B] bool marks the rows whose completions are
    the data's (None: every row); on those, `cross_entropy` also sums the student's cross-entropy, and
    without `follow_teacher_mistakes` a token where the teacher's likeliest token is not the label
    scores the student's cross-entropy instead of the divergence. Gradients reach the student's
    hidden states and head only. With `aligned`, `labels` are already shifted (position t's label is
    the token at t + 1: a context-parallel rank's piece of the rows, ditty.data.context_shard).

    Under tensor parallel (the student's head split by vocabulary rows, ditty.parallel.tensor) each
    rank computes its rows' columns of both models' logits and the group sums what each token needs
    (ditty.objectives.jsd_shards); the teacher, split like the student, has the same rows."""
    shard = None
    if tensor_parallel_rows(student_head.weight):
        student_head, teacher_head, shard = _vocabulary_rows(student_head, teacher_head)
        student_hidden = copy_to_group(_whole(student_hidden), shard)
        teacher_hidden = _whole(teacher_hidden)
    target = labels.to(student_hidden.device) if aligned else shifted(labels.to(student_hidden.device))
    data_token = (
        torch.ones_like(target, dtype=torch.bool) if data_rows is None else data_rows.to(target.device)[:, None]
    )
    data_token = data_token.expand_as(target).reshape(-1)
    target = target.reshape(-1)
    rows = (target != IGNORE_INDEX).nonzero().squeeze(1)  # one host sync, as the fused loss
    student = student_hidden.reshape(-1, student_hidden.shape[-1]).index_select(0, rows)
    teacher = teacher_hidden.reshape(-1, teacher_hidden.shape[-1]).index_select(0, rows).detach()
    target, data_token = target.index_select(0, rows), data_token.index_select(0, rows)
    dtype = torch.float64 if student.dtype == torch.float64 else torch.float32
    sums = student.new_zeros(3, dtype=dtype) + 0.0 * student_head.weight.sum()
    if rows.numel():
        size = max(1, math.ceil(rows.numel() / chunks))
        for start in range(0, rows.numel(), size):
            piece = slice(start, start + size)
            sums = sums + checkpoint(
                _chunk, student[piece], teacher[piece], target[piece], data_token[piece], student_head, teacher_head,
                beta, temperature, cross_entropy, follow_teacher_mistakes, shard, use_reentrant=False,
            )  # fmt: skip
    return DistillSums(sums[0], sums[1], torch.as_tensor(rows.numel()), sums[2].detach())


def _chunk(
    student, teacher, target, data_token, student_head: Projection, teacher_head: Projection,
    beta, temperature, cross_entropy, follow_teacher_mistakes, shard,
):  # fmt: skip
    """[the chunk's divergence sum, its cross-entropy sum over the data tokens (when asked), how many
    tokens it corrected] (the cross-entropy at temperature 1: the plain SFT loss). The teacher is wrong
    where another token's logit is above the label's (a tie is not a mistake)."""
    with torch.no_grad():
        teacher_logits = _logits(teacher, teacher_head)
    logits = _logits(student, student_head)
    divergence = jsd_per_token(logits, teacher_logits, beta, temperature, shard)
    per_token, corrected = None, divergence.new_zeros(())
    if cross_entropy or not follow_teacher_mistakes:
        if shard is None:
            per_token = torch.nn.functional.cross_entropy(logits.to(divergence.dtype), target, reduction="none")
        else:
            per_token = -pick(log_softmax(logits.to(divergence.dtype), shard), target, shard)
    if not follow_teacher_mistakes:
        label_logit = pick(teacher_logits, target, shard)
        mistakes = data_token & (label_logit < max_over_group(teacher_logits.amax(-1), shard))
        divergence = torch.where(mistakes, per_token, divergence)
        corrected = mistakes.sum().to(divergence.dtype)
    hard = (per_token * data_token.to(per_token.dtype)).sum() if cross_entropy else divergence.new_zeros(())
    return torch.stack([divergence.sum(), hard, corrected])


def _logits(hidden: Tensor, head: Projection) -> Tensor:
    logits = torch.nn.functional.linear(hidden * head.scale if head.scale != 1.0 else hidden, head.weight, head.bias)
    if head.softcap:
        logits = torch.tanh(logits / head.softcap) * head.softcap
    return logits


def _vocabulary_rows(student_head: Projection, teacher_head: Projection) -> "tuple[Projection, Projection, VocabGroup]":
    """Both heads as this rank's rows of the vocabulary, and the group that holds the others. The
    student's weight is a tensor-parallel row shard; the teacher's is one too (split like the student),
    or whole where its engine gathered it, and then cut to the student's rows."""
    from ditty.stages.vocab_parallel_logps import local_vocab_rows

    weight, shard = local_vocab_rows(student_head.weight)
    rows = slice(shard.start, shard.start + weight.shape[0])

    def mine(tensor: Optional[Tensor]) -> Optional[Tensor]:
        if tensor is None:
            return None
        if tensor_parallel_rows(tensor):
            local, theirs = local_vocab_rows(tensor)
            if theirs.start != shard.start or local.shape[0] != weight.shape[0]:
                raise ValueError("the teacher's head is split over other vocabulary rows than the student's")
            return local
        return _whole(tensor)[rows]

    bias = local_vocab_rows(student_head.bias)[0] if student_head.bias is not None else None
    student = replace(student_head, weight=weight, bias=bias)
    teacher = replace(teacher_head, weight=mine(teacher_head.weight), bias=mine(teacher_head.bias))
    return student, teacher, VocabGroup(shard.group, shard.start)


def _whole(tensor: Tensor) -> Tensor:
    """A DTensor's whole value on this rank (gathered differentiably); a plain tensor as it is."""
    from ditty.stages.fused_loss import replicated

    return replicated(tensor)
