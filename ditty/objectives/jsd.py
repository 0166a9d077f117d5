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
from typing import NamedTuple, Optional

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ditty._utils.labels import IGNORE_INDEX
from ditty.stages.fused_loss import Projection, shifted


def jsd_per_token(student_logits: Tensor, teacher_logits: Tensor, beta: float, temperature: float = 1.0) -> Tensor:
    """The generalised JSD of every row of [tokens, vocab] logits, as TRL's generalized_jsd_loss computes
    it before reducing (in fp32; fp64 for fp64 logits, the exact checks)."""
    dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32
    student = torch.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    teacher = torch.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    if beta == 0:
        return _kl(teacher, student)
    if beta == 1:
        return _kl(student, teacher)
    mixture = torch.logsumexp(torch.stack([student + math.log(1 - beta), teacher + math.log(beta)]), dim=0)
    return beta * _kl(teacher, mixture) + (1 - beta) * _kl(student, mixture)


def _kl(p_log: Tensor, q_log: Tensor) -> Tensor:
    """KL(P || Q) per row, from log-probabilities."""
    return (p_log.exp() * (p_log - q_log)).sum(-1)


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
) -> DistillSums:
    """The divergence of the student from the teacher, summed over the scored tokens. `labels` [B, T]
    follow Hugging Face's convention (position t's hidden state predicts label t + 1); hidden states
    are the output heads' inputs [B, T, H]. `data_rows` [B] bool marks the rows whose completions are
    the data's (None: every row); on those, `cross_entropy` also sums the student's cross-entropy, and
    without `follow_teacher_mistakes` a token where the teacher's likeliest token is not the label
    scores the student's cross-entropy instead of the divergence. Gradients reach the student's
    hidden states and head only."""
    target = shifted(labels.to(student_hidden.device))
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
                beta, temperature, cross_entropy, follow_teacher_mistakes, use_reentrant=False,
            )  # fmt: skip
    return DistillSums(sums[0], sums[1], torch.as_tensor(rows.numel()), sums[2].detach())


def _chunk(
    student, teacher, target, data_token, student_head: Projection, teacher_head: Projection,
    beta, temperature, cross_entropy, follow_teacher_mistakes,
):  # fmt: skip
    """[the chunk's divergence sum, its cross-entropy sum over the data tokens (when asked), how many
    tokens it corrected] (the cross-entropy at temperature 1: the plain SFT loss). The teacher is wrong
    where another token's logit is above the label's (a tie is not a mistake)."""
    with torch.no_grad():
        teacher_logits = _logits(teacher, teacher_head)
    logits = _logits(student, student_head)
    divergence = jsd_per_token(logits, teacher_logits, beta, temperature)
    per_token, corrected = None, divergence.new_zeros(())
    if cross_entropy or not follow_teacher_mistakes:
        per_token = torch.nn.functional.cross_entropy(logits.to(divergence.dtype), target, reduction="none")
    if not follow_teacher_mistakes:
        label_logit = teacher_logits.gather(-1, target[:, None]).squeeze(-1)
        mistakes = data_token & (label_logit < teacher_logits.amax(-1))
        divergence = torch.where(mistakes, per_token, divergence)
        corrected = mistakes.sum().to(divergence.dtype)
    hard = (per_token * data_token.to(per_token.dtype)).sum() if cross_entropy else divergence.new_zeros(())
    return torch.stack([divergence.sum(), hard, corrected])


def _logits(hidden: Tensor, head: Projection) -> Tensor:
    logits = torch.nn.functional.linear(hidden * head.scale if head.scale != 1.0 else hidden, head.weight, head.bias)
    if head.softcap:
        logits = torch.tanh(logits / head.softcap) * head.softcap
    return logits
