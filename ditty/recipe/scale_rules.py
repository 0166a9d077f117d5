"""Compiler rules of tensor and context parallel (`parallel.tp`, `parallel.cp`): the support table
and the sizes the degrees must divide.

The support table is one list, SCALE_RULES: each row is a combination that ditty refuses with
tp or cp above 1, why, and the fix. README's "Tensor and context parallel" table is generated from
it (`python -m ditty.recipe.scale_rules`), and tests/recipe/test_scale_rules.py trips every row
with a recipe and keeps README in step. The rows about the parallel kind are decided by the mesh
itself (`ditty.parallel.mesh.mesh_shape`, reported by the rule parallel.mesh); the others by
`scale_support` here. `scale_sizes` reads the model's sizes offline (a local or cached
config.json, or the architecture's defaults with model.config) and checks what must divide what
(ditty.parallel.tp_table.divisibility).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional

from ditty.config.errors import Problem
from ditty.objectives.table import objective_name
from ditty.parallel.mesh import KIND_REFUSAL_FIX, KIND_REFUSALS, kind_refusal_rule
from ditty.parallel.tp_table import TP_MODEL_TYPES, ModelDims, divisibility
from ditty.recipe.compatibility_rules import CompatRule
from ditty.recipe.rules import Context, error, rule

CP_ATTENTION = ("auto", "sdpa")
"""`model.attn_implementation` values Ulysses wraps (SDPA, and ditty's per-sample SDPA for packed rows)."""


CP_ROWS = ("dpo", "ipo", "simpo", "orpo", "kto")
"""The preference rows that train under context parallel: the DPO family on the data's pairs (KTO: its
examples), each completion's log-probability summed over its pieces (ditty.objectives.context_rows). GKD does too on
the data's completions alone (distill.lmbda = 0): its loss is a sum over tokens, as SFT's."""

SAMPLING_ROWS = ("grpo", "rloo", "online-pairs", "gkd")
"""The rows that sample from the policy while they train (rollout.backend applies to them)."""

TP_TASKS = ("causal-lm", "reward-model")
"""The model tasks ditty splits under tensor and context parallel: causal LMs and their sequence classifiers
with one score (ditty.parallel.tensor replicates the score head and runs it sequence parallel; under cp
each row's score is read from the piece that holds its last token, ditty.objectives.context_rows). Every objective
row trains under tensor parallel: per-token log-probabilities run on the head's vocabulary shards
(ditty.stages.vocab_parallel_logps), distillation's divergence too (ditty.objectives.jsd_shards), and a
tensor-parallel group shares its prompts and samples them alike with generate."""


def _tp(c: Any) -> bool:
    return c.parallel.tp > 1


def _cp(c: Any) -> bool:
    return c.parallel.cp > 1


def _cp_row(c: Any) -> bool:
    """The row trains on pieces of rows: supervised, the DPO family on data pairs, GKD on the data alone."""
    name = objective_name(c)
    return name in ("supervised", "reward-model", *CP_ROWS) or (name == "gkd" and c.distill.lmbda == 0)


def _either(c: Any) -> bool:
    return _tp(c) or _cp(c)


@dataclass(frozen=True)
class SupportRow(CompatRule):
    by_mesh: bool = False
    """Decided by `mesh_shape` (a mesh that cannot exist), not by `scale_support`."""


def _kind_row(kind: str, name: str) -> SupportRow:
    return SupportRow(
        kind_refusal_rule(kind),
        "parallel.tp",
        lambda c, kind=kind: _either(c) and c.parallel.kind == kind,
        KIND_REFUSALS[kind],
        KIND_REFUSAL_FIX,
        condition=f"tp or cp above 1 with parallel.kind = {name}",
        by_mesh=True,
    )


SCALE_RULES: list[SupportRow] = [
    _kind_row("none", '"none"'),
    _kind_row("ddp", '"ddp"'),
    _kind_row("hsdp", '"hsdp"'),
    _kind_row("deepspeed", '"deepspeed"'),
    SupportRow(
        "scale.tp-adapter",
        "peft.kind",
        lambda c: _tp(c) and c.peft.kind != "none",
        "ditty's tensor-parallel plan splits the base model's Linear layers by name; PEFT wraps them "
        "(q_proj.base_layer) and its A and B matrices would need plans of their own, which ditty does not write",
        "use parallel.cp with an adapter (context parallel leaves the weights whole), or fsdp alone, or full "
        "finetuning with tp",
        condition="tp above 1 with peft.kind lora or dora",
    ),
    SupportRow(
        "scale.tp-quantized",
        "quant.kind",
        lambda c: _tp(c) and c.quant.kind != "none",
        "bitsandbytes packs quantized weights into blocks with per-block scales (uint8 storage); they cannot be "
        "cut into row or column shards",
        "train the quantized base (QLoRA) with fsdp and tp = 1",
        condition="tp above 1 with quant.kind set",
    ),
    SupportRow(
        "scale.cp-quantized",
        "quant.kind",
        lambda c: _cp(c) and c.quant.kind != "none",
        "a quantized base under context parallel is not verified (ditty's QLoRA tests run FSDP2 alone)",
        "use cp with a LoRA adapter on an unquantized base, or QLoRA with fsdp and cp = 1",
        condition="cp above 1 with quant.kind set",
    ),
    SupportRow(
        "scale.fp8",
        "fp8.enabled",
        lambda c: _either(c) and c.fp8.enabled,
        "torchao's float8 linears need tensor-parallel styles of their own (Float8ColwiseParallel and friends), "
        "which ditty does not apply, and float8 with context parallel is not verified",
        "disable fp8 with tp or cp",
        condition="tp or cp above 1 with fp8.enabled",
    ),
    SupportRow(
        "scale.compile",
        "train.compile",
        lambda c: _either(c) and c.train.compile,
        "ditty compiles blocks before its engine parallelizes them, and the tensor-parallel hooks and the "
        "Ulysses all-to-all must be in place first (torchtitan's order: tensor parallel, checkpointing, compile, "
        "FSDP)",
        "set train.compile = false with tp or cp",
        condition="tp or cp above 1 with train.compile",
    ),
    SupportRow(
        "scale.task",
        "model.task",
        lambda c: (_either(c) and c.model.task not in TP_TASKS) or (_either(c) and bool(c.model.factory)),
        "the tensor-parallel plans and the Ulysses attention are written for causal language models of the "
        f"families {', '.join(TP_MODEL_TYPES)} and their reward models (a score head on every token); other "
        "classifier heads, encoders and custom models have none",
        'use model.task = "causal-lm" or "reward-model" with one of those families, or tp = cp = 1',
        condition='tp or cp above 1 with a model.task other than "causal-lm" or "reward-model", or a model.factory',
    ),
    SupportRow(
        "scale.model-type",
        "model.architecture",
        lambda c: _either(c) and _known_type(c) not in (None, *TP_MODEL_TYPES),
        f"ditty has tensor- and context-parallel plans for {', '.join(TP_MODEL_TYPES)} only",
        "use a model of those families, or tp = cp = 1 (fsdp shards any model)",
        condition="tp or cp above 1 with a model type outside the verified families",
    ),
    SupportRow(
        "scale.post-training",
        "data.format",
        lambda c: _cp(c) and not _cp_row(c),
        "context parallel cuts each row into pieces along the sequence; the DPO family on the data's pairs or "
        "examples sums each completion's pieces over the context ranks, the reward model reads each row's last "
        "token from the piece that holds it, and distillation on the data's completions scores each piece's "
        "tokens, but the samples of RL, online pairs and on-policy distillation are whole rows a rank makes alone",
        "train those stages with tp (every post-training row takes it) or fsdp alone, and cp = 1 (distillation: "
        "distill.lmbda = 0 takes cp)",
        condition="cp above 1 with a row other than supervised, the reward model, the DPO family (DPO, IPO, SimPO, "
        "ORPO, KTO) on the data, or GKD with distill.lmbda = 0",
    ),
    SupportRow(
        "scale.cp-pairs",
        "preference.reference",
        lambda c: _cp(c) and objective_name(c) in CP_ROWS and (c.preference.reference == "precompute" or _tp(c)),
        "under cp a reference table keyed by whole rows has nothing to look up on a rank's piece, and the "
        "vocabulary-sharded scoring of tp does not read a piece's shifted labels",
        'use preference.reference = "auto" (the reference scores each piece beside the policy), and tp or cp, '
        "not both, for the DPO family",
        condition='cp above 1 with the DPO family and preference.reference = "precompute" or tp above 1',
    ),
    SupportRow(
        "scale.tp-rollout-engine",
        "rollout.backend",
        lambda c: _tp(c) and c.rollout.engine != "generate" and objective_name(c) in SAMPLING_ROWS,
        "a vLLM engine takes whole weights from each rank, and under tp each rank holds its shard of every "
        "layer: sampling under tp is generate on the sharded policy itself",
        'use rollout.backend = "generate" with tp, or tp = 1 for vLLM',
        condition='tp above 1 with a row that samples (GRPO, RLOO, online pairs, GKD) and rollout.backend "vllm" '
        'or "vllm-server"',
    ),
    SupportRow(
        "scale.pipeline-loss",
        "pipeline.loss",
        lambda c: _either(c) and bool(c.pipeline.loss),
        "a custom loss would see vocabulary-sharded logits (DTensors) under tp and, under cp, one slice of each "
        "row with labels already shifted (`shift_labels`)",
        "remove [[pipeline.loss]] (ditty's causal-LM loss, full or chunked, handles both), or tp = cp = 1",
        condition="tp or cp above 1 with a [[pipeline.loss]]",
    ),
    SupportRow(
        "scale.tp-loss-kernel",
        "train.loss_backend",
        lambda c: _tp(c) and c.train.loss_chunks > 0 and c.train.loss_backend in ("liger", "cce"),
        "the liger and cce kernels take the whole output-head weight; under tp each rank holds a vocabulary shard",
        'use train.loss_backend = "chunked" (or "auto"): its chunks run on the shards',
        condition='tp above 1 with train.loss_backend "liger" or "cce"',
    ),
    SupportRow(
        "scale.cp-attention",
        "model.attn_implementation",
        lambda c: _cp(c) and c.model.attn_implementation not in CP_ATTENTION,
        "ditty's Ulysses attention wraps SDPA (and its per-sample SDPA for packed rows); another kernel would "
        "be bypassed",
        'set model.attn_implementation = "auto" (or "sdpa") with cp',
        condition='cp above 1 with model.attn_implementation other than "auto" or "sdpa"',
    ),
    SupportRow(
        "scale.cp-sliding-window",
        "parallel.cp",
        lambda c: _cp(c) and _window_shorter_than_rows(c),
        "the model attends within a sliding window shorter than data.max_seq_len, and ditty's Ulysses attention "
        "is plain causal attention over the whole row",
        "set data.max_seq_len at most the model's sliding window, or cp = 1",
        condition="cp above 1 with a sliding window shorter than data.max_seq_len",
    ),
]


@rule("scale.support")
def scale_support(ctx: Context) -> Iterator[Problem]:
    """Every row of the tensor/context-parallel support table that the mesh does not already decide."""
    for row in SCALE_RULES:
        if not row.by_mesh and row.when(ctx.config):
            yield Problem(row.key, row.message, fix=row.fix, severity=row.severity, rule=row.id)


@rule("scale.sizes")
def scale_sizes(ctx: Context) -> Iterator[Problem]:
    """tp divides the heads, key/value heads and MLP width, and leaves every rank a share of the vocabulary;
    tp x cp divides the heads; cp the rows."""
    cfg = ctx.config
    if not _either(cfg):
        return
    dims = recipe_model_dims(cfg)
    if dims is None:
        return
    for found in divisibility(dims, cfg.parallel.tp, cfg.parallel.cp, cfg.data.max_seq_len):
        yield error(found.key, found.message, found.fix)


# --------------------------------------------------------------------------- the model's sizes, offline

BYTE_TOKENIZER_SIZE = 259
"""Tokens of ditty's built-in byte tokenizer (3 special tokens and 256 bytes; a test checks the
number against the tokenizer): the vocabulary a random-init model gets from it."""


def recipe_model_dims(config: Any) -> Optional[ModelDims]:
    """The sizes of the model a recipe builds, from a local or cached config.json, or the architecture's
    defaults with model.config (transformers' config class only: no weights, no network); None when
    they cannot be known offline (the builder checks again with the built model)."""
    values = _config_values(config.model)
    if values is None:
        return None
    model = config.model
    tokenizer = getattr(config, "tokenizer", None)
    byte_tokens = tokenizer is not None and tokenizer.source(model) is None
    if byte_tokens and "vocab_size" not in model.config:
        # The builder sizes a random model from the tokenizer and grows a checkpoint's table to fit it.
        current = int(values.get("vocab_size") or 0)
        values["vocab_size"] = (
            BYTE_TOKENIZER_SIZE if model.resolved_init == "random" else max(current, BYTE_TOKENIZER_SIZE)
        )
    try:
        return ModelDims.from_config(values)
    except (KeyError, TypeError, ValueError):
        return None


def _config_values(model: Any) -> Optional[dict[str, Any]]:
    if model.factory:
        return None
    if model.path:
        from ditty.models.source import read_model_config

        found = read_model_config(model)
        return {**found, **model.config} if found is not None else None
    if not model.architecture:
        return None
    try:
        from transformers import AutoConfig

        return AutoConfig.for_model(model.architecture, **model.config).to_dict()
    except Exception:  # noqa: BLE001 - an unknown architecture or bad model.config is another rule's to report
        return None


def _known_type(config: Any) -> Optional[str]:
    values = _config_values(config.model)
    return values.get("model_type") if values is not None else None


def _window_shorter_than_rows(config: Any) -> bool:
    dims = recipe_model_dims(config)
    return dims is not None and dims.sliding_window is not None and dims.sliding_window < config.data.max_seq_len


def support_table_markdown() -> str:
    rows = ["| rule | when | why | fix |", "|---|---|---|---|"]
    for row in SCALE_RULES:
        rows.append(f"| `{row.id}` | {row.condition} | {row.message} | {row.fix} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(support_table_markdown())
