"""The on-policy distillation row (`[distill] kind = "gkd"`): GKD (Agarwal et al. 2024, TRL's GKDTrainer).

The student (`[model]`) learns the teacher's (`distill.teacher`) token distributions on the completion
tokens of SFT data, through the generalised Jensen-Shannon divergence with interpolation `beta`
(ditty.objectives.jsd: 0 is the forward KL, 1 the reverse KL; summed in chunks from hidden states, so
no [batch, length, vocab] logits of either model exist at once). A share `lmbda` of the steps trains
on completions the student samples itself from the batch's prompts (on-policy: the student learns
where it actually goes), the rest on the data's completions; the first `data_only_steps` all read the
data. With `teacher_mistakes = "data"`, a token of the data's completions where the teacher's
likeliest next token is not the data's is learnt from the data (the student's cross-entropy) instead
of the teacher's distribution: the student does not copy the teacher's wrong answers. The coin and
the samples are seeded by the step and the samples' global positions, so a resume draws the same.

The teacher is a frozen model loaded like a reference (ditty.objectives.reference: sharded like the
student under fsdp/hsdp), run without gradients on the student's batch.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from ditty._utils.labels import IGNORE_INDEX, SHIFTED_LABELS
from ditty.config.errors import Problem, RecipeError, error, warning
from ditty.models.inputs import model_inputs
from ditty.objectives.footprint import Footprint, reference_footprint
from ditty.objectives.jsd import chunked_jsd
from ditty.objectives.parts import ObjectiveParts, no_step_metrics, nothing_to_do
from ditty.stages.fused_loss import HEAD_INPUT, emit_head_input, head_projection, output_head
from ditty.stages.fused_loss.head import model_config
from ditty.stages.loss import LossCalculator, LossOutput

# ---------------------------------------------------------------------------------------- the loss stage

SAMPLED = "distill_sampled"
"""The batch key of on-policy micro-batches: [B] bool, True for rows whose completion the student sampled."""


class GKDLoss(LossCalculator):
    """The generalised JSD to the teacher, summed over the completion tokens of a micro-batch (the
    trainer divides by the completion tokens of the whole global batch), plus `distill.sft_weight`
    times the student's cross-entropy on the rows whose completions are the data's (not marked
    `SAMPLED`); with `distill.teacher_mistakes = "data"` those rows' tokens where the teacher's
    likeliest token is not the data's score the cross-entropy instead of the divergence. `teacher`: a
    frozen model (ditty.objectives.reference.Reference) whose `scoring()` yields it."""

    reports_val_metrics = True
    uses_head_input = True

    def __init__(self, distill: Any, teacher: Any) -> None:
        super().__init__(output_index=0, target_key="labels", mask_key=None, name="gkd")
        self.distill, self.teacher = distill, teacher

    def count_tokens(self, batch: Mapping) -> Tensor:
        if "labels" not in batch and SHIFTED_LABELS in batch:  # a context-parallel piece of the rows
            return (batch[SHIFTED_LABELS] != IGNORE_INDEX).sum()
        return (batch["labels"][..., 1:] != IGNORE_INDEX).sum()

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        batch, model = ctx["batch"], ctx["model"]
        with torch.no_grad(), self.teacher.scoring() as teacher:
            with emit_head_input(teacher) as head:  # the student's inputs as they are (packed rows included)
                teacher(**model_inputs(teacher, batch))
            teacher_head = head_projection(output_head(teacher), model_config(teacher), keep_vocab_shards=True)
        weight = self.distill.sft_weight
        # Held out, the student's cross-entropy on the data's completions is reported beside the
        # divergence (val_distill/cross_entropy), so a distilled student reads against plain SFT's val_loss.
        evaluating = not ctx.get("training", True)
        correct_mistakes = self.distill.teacher_mistakes == "data"
        sampled = batch.get(SAMPLED)
        piece = "labels" not in batch and SHIFTED_LABELS in batch  # context parallel: labels already shifted
        sums = chunked_jsd(
            ctx[HEAD_INPUT],
            head_projection(output_head(model), model_config(model), keep_vocab_shards=True),
            head.hidden,
            teacher_head,
            batch[SHIFTED_LABELS] if piece else batch["labels"],
            beta=self.distill.beta,
            temperature=self.distill.temperature,
            chunks=self.distill.chunks,
            data_rows=None if sampled is None else ~sampled,
            cross_entropy=bool(weight) or evaluating,
            follow_teacher_mistakes=not correct_mistakes,
            aligned=piece,
        )
        per_token = 1.0 / max(int(sums.tokens), 1)  # the metrics are this micro-batch's means
        metrics = {}
        if weight or evaluating:
            metrics["distill/divergence"] = float(sums.divergence.detach()) * per_token
            metrics["distill/cross_entropy"] = float(sums.cross_entropy.detach()) * per_token
        if correct_mistakes:  # the share of tokens that learned the data's token, not the teacher's
            metrics["distill/corrected"] = float(sums.corrected) * per_token
        loss = sums.divergence + weight * sums.cross_entropy if weight else sums.divergence
        return LossOutput(loss, metrics=metrics, num_tokens=sums.tokens)


# ---------------------------------------------------------------------------------------- on-policy batches


class OnPolicyStream:
    """The data's micro-batches; on a share `lmbda` of the steps, their completions replaced by the
    student's own samples from the same prompts (a prompt is a row's tokens before its first label),
    each row cut to `max_seq_len` tokens as the data's rows are."""

    def __init__(
        self,
        inner: Any,
        sampler: Any,
        distill: Any,
        seed: int,
        pad_token_id: int,
        *,
        rank: int,
        micro_batch_size: int,
        max_seq_len: int,
    ) -> None:
        self.inner, self.sampler, self.distill = inner, sampler, distill
        self.seed, self.pad_token_id = seed, pad_token_id
        self.rank, self.micro_batch_size, self.max_seq_len = rank, micro_batch_size, max_seq_len
        self.steps = 0
        self.on_policy_steps = 0

    @property
    def cursor(self) -> int:
        return self.inner.cursor

    @property
    def accumulation_steps(self) -> int:
        return self.inner.accumulation_steps

    def next_step(self) -> list[dict]:
        first = self.inner.cursor  # the global position of the step's first sample: it seeds the sampling
        batches = self.inner.next_step()
        # the coin is drawn on every step, so a step's draw is the same whatever data_only_steps is
        draw = random.Random(self.seed * 1_000_003 + self.steps).random()
        on_policy = self.steps >= self.distill.data_only_steps and draw < self.distill.lmbda
        self.steps += 1
        if not on_policy:
            return batches
        self.on_policy_steps += 1
        # A rank's micro-batches are one contiguous slice of the global step (ditty.data.batching.
        # micro_batches_of_rank): each is seeded by its first row's global position, so every world
        # size draws the same completions for the same rows.
        size = self.micro_batch_size
        mine = first + self.rank * size * len(batches)
        return [self.sampled(batch, mine + index * size) for index, batch in enumerate(batches)]

    def sampled(self, batch: dict, position: int) -> dict:
        from ditty.data.collate import pad_samples

        prompts = [prompt_of(ids, labels) for ids, labels in zip(batch["input_ids"], batch["labels"])]
        rollouts = self.sampler.sample(prompts, position)
        cut = self.max_seq_len
        samples = [
            ((p + c)[:cut], ([IGNORE_INDEX] * len(p) + c)[:cut])
            for p, c in zip(rollouts.prompt_ids, rollouts.completion_ids)
        ]
        out = pad_samples(samples, self.pad_token_id)
        del out["position_ids"]
        out[SAMPLED] = torch.ones(len(samples), dtype=torch.bool)
        return out

    def step_metrics(self) -> dict[str, float]:
        return {"distill/on_policy_share": self.on_policy_steps / max(self.steps, 1)}

    def source_tokens(self) -> dict[str, int]:
        return self.inner.source_tokens()

    def close(self) -> None:
        self.sampler.close()
        self.inner.close()

    def state_dict(self) -> dict:
        return {"data": self.inner.state_dict(), "steps": self.steps, "on_policy_steps": self.on_policy_steps}

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state["data"])
        self.steps, self.on_policy_steps = int(state["steps"]), int(state["on_policy_steps"])


def prompt_of(input_ids: Tensor, labels: Tensor) -> list[int]:
    """A collated row's prompt: its tokens before the first scored label."""
    scored = (labels != IGNORE_INDEX).nonzero()
    end = int(scored[0]) if len(scored) else int((input_ids != IGNORE_INDEX).sum())
    return input_ids[:end].tolist()


# ---------------------------------------------------------------------------------------- the row


def build_distill(run: Any) -> ObjectiveParts:
    from ditty.objectives.reference import build_reference
    from ditty.objectives.sampling.policy_sampling import PolicySampling
    from ditty.objectives.sampling.sampler import build_sampler

    config = run.config
    distill = config.distill
    teacher = build_reference(run, distill.teacher, chunks=distill.chunks, key="distill.teacher")
    check_vocabulary(run.engine.unwrap(run.model), teacher.model, distill.teacher)
    stream: Optional[OnPolicyStream] = None
    if distill.lmbda > 0:
        data = run.data.stream(run.plan.accumulation_steps)
        policy = lambda: run.engine.unwrap(run.model)  # noqa: E731
        sampling = PolicySampling(build_sampler(run, policy, group_size=1, rollout=student_sampling(config)))
        pad = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else 0
        stream = OnPolicyStream(
            data,
            sampling,
            distill,
            config.run.seed,
            pad,
            rank=run.runtime.data_rank,  # the rank the data stream slices by (tensor-parallel peers share it)
            micro_batch_size=config.train.micro_batch_size,
            max_seq_len=config.data.max_seq_len,
        )
    return ObjectiveParts(
        loss=GKDLoss(distill, teacher),
        stream=stream,
        reference=teacher,
        step_metrics=stream.step_metrics if stream is not None else no_step_metrics,
        after_update=sampling.updated if stream is not None else nothing_to_do,
    )


def student_sampling(config: Any) -> Any:
    """[rollout], with the student's samples capped at data.max_seq_len tokens (a row holds at most that)."""
    from dataclasses import replace

    rollout = config.rollout
    return replace(rollout, max_new_tokens=min(rollout.max_new_tokens, config.data.max_seq_len))


def check_vocabulary(student: torch.nn.Module, teacher: torch.nn.Module, path: str) -> None:
    """The divergence compares distributions over one vocabulary: the teacher's head must have the student's."""
    mine, theirs = output_head(student).weight.shape[0], output_head(teacher).weight.shape[0]
    if mine != theirs:
        raise RecipeError.single(
            f"the teacher {path} scores {theirs} tokens and the student {mine}: distillation compares "
            "distributions over one vocabulary",
            key="distill.teacher",
            fix="use a teacher trained with the student's tokenizer (the same vocabulary)",
        )


def distill_rules(ctx: Any) -> Iterator[Problem]:
    cfg = ctx.config
    distill = cfg.distill
    if not distill.teacher:
        yield error("distill.teacher", "names no teacher", 'set distill.teacher = "runs/tiny_sft/final" (a model path)')
    else:
        from ditty.models.source import frozen_model_problems

        yield from frozen_model_problems(distill.teacher, "distill.teacher", "teacher")
    checks = [
        ("beta", 0.0 <= distill.beta <= 1.0, "in [0, 1] (0: forward KL, 1: reverse KL)"),
        ("lmbda", 0.0 <= distill.lmbda <= 1.0, "in [0, 1] (the share of on-policy steps)"),
        ("temperature", distill.temperature > 0, "above 0"),
        ("chunks", distill.chunks >= 1, "at least 1"),
        ("sft_weight", distill.sft_weight >= 0, "0 or more"),
        ("data_only_steps", distill.data_only_steps >= 0, "0 or more"),
    ]
    for key, ok, wanted in checks:
        if not ok:
            yield error(f"distill.{key}", f"must be {wanted}, got {getattr(distill, key)!r}", f"set it {wanted}")
    if distill.lmbda > 0:  # the student samples: how is [rollout]'s
        from ditty.objectives.sampling.rollout_rules import rollout_rules

        yield from rollout_rules(ctx, row="on-policy distillation")
    if distill.lmbda == 1:
        unused = [("sft_weight", distill.sft_weight > 0), ("teacher_mistakes", distill.teacher_mistakes == "data")]
        for key, set_ in unused:
            if set_:
                yield warning(
                    f"distill.{key}",
                    "has no effect: with lmbda = 1 every step trains on the student's own samples, and it "
                    "acts only on the data's completions",
                    f"lower distill.lmbda, or remove {key}",
                )
    steps = cfg.train.steps
    if distill.lmbda > 0 and distill.data_only_steps and steps is not None and distill.data_only_steps >= steps:
        yield warning(
            "distill.data_only_steps",
            f"is {distill.data_only_steps} and the run has {steps} steps: no step samples on-policy, "
            "lmbda has no effect",
            f"set data_only_steps below {steps}, or lmbda = 0",
        )
    if cfg.model.task != "causal-lm":
        yield error("distill.kind", f'distils a causal LM, and model.task is "{cfg.model.task}"', "remove [distill]")
    if cfg.data.packing and distill.lmbda > 0:
        yield error(
            "data.packing",
            "on-policy distillation samples a completion for each row's prompt, and packed rows hold several",
            "set data.packing = false, or distill.lmbda = 0 (the data's completions only)",
        )
    if cfg.pipeline.loss:
        yield error("pipeline.loss", "[distill] brings its own loss", "remove [[pipeline.loss]] (or [distill])")


def describe_distill(config: Any) -> list[tuple[str, str]]:
    d = config.distill
    text = (
        f"gkd from {d.teacher}: generalised JSD beta {d.beta:g} at temperature {d.temperature:g}, on-policy share "
        f"{d.lmbda:g}{after_data_only(d)} (at most {config.rollout.max_new_tokens} new tokens at temperature "
        f"{config.rollout.temperature:g}, {config.rollout.engine}), in {d.chunks} chunks"
        + (f", plus {d.sft_weight:g} x cross-entropy on the data's completions" if d.sft_weight else "")
        + not_following(d)
    )
    return [("distill", text)]


def distill_footprint(config: Any, world_size: int) -> Footprint:
    d = config.distill
    prompts = max(1, config.train.micro_batch_size)
    return reference_footprint(
        config,
        d.teacher or "none",
        method="gkd",
        rollout_sequences=prompts if d.lmbda > 0 else 0,
        rollout_tokens=config.data.max_seq_len + student_sampling(config).max_new_tokens,
        chunks=d.chunks,
    )


def distill_card(config: Any) -> str:
    d = config.distill
    hard = (f", cross-entropy weight {d.sft_weight:g}" if d.sft_weight else "") + not_following(d)
    share = f"on-policy share {d.lmbda:g}{after_data_only(d)}"
    return f"; distilled from {d.teacher} (GKD: generalised JSD beta {d.beta:g}, {share}{hard})"


def after_data_only(d: Any) -> str:
    return f" after {d.data_only_steps} steps on the data's completions" if d.lmbda and d.data_only_steps else ""


def not_following(d: Any) -> str:
    """The plan's and the card's words for `teacher_mistakes = "data"`."""
    return (
        ", cross-entropy on the data's token where the teacher's argmax is another"
        if d.teacher_mistakes == "data"
        else ""
    )
