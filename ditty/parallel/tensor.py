"""Tensor parallel (with sequence parallel) for the causal LMs of ditty.parallel.tp_table, by DTensor.

`apply_tensor_parallel(model, tp_mesh)` calls torch's `parallelize_module` with the model's plan
(its config's `base_model_tp_plan`, else ditty's table) plus what the trainer needs around it, in
torchtitan's layout (torchtitan/models/llama3/infra/parallelize.py, `apply_tp`):

- the embedding is split by vocabulary rows; its output leaves reduce-scattered along the sequence;
- every RMSNorm runs sequence parallel (each rank normalises its slice of the tokens, the weight
  replicated, its gradient all-reduced);
- attention and MLP gather the sequence on entry (all-gather), q/k/v and gate/up are split by output
  columns (heads, MLP width), o_proj and down_proj by input rows, and their outputs leave
  reduce-scattered along the sequence again;
- Qwen3's per-head q_norm/k_norm see each rank's heads, with the weight replicated;
- the output head is split by vocabulary rows and, in training, its logits stay sharded: the loss
  runs on the shards (ditty.stages.vocab_parallel); in evaluation and generation they are gathered.
  A sequence classifier's `score` head (the reward model's one output per token) is replicated and
  runs sequence parallel like the norms, its scores gathered along the sequence: transformers reads
  each row at its last token that is not padding, which may lie on any rank's slice;
- the vocabulary need not divide by tp: DTensor cuts the rows as `torch.chunk` does (259 tokens over
  2 ranks: 130 and 129), the collectives pad the short shard themselves, and the parameters keep the
  model's own shape, so checkpoints, `final/` and `ditty export` hold the original vocabulary and a
  checkpoint resumes on any other degree;
- a head tied to the embedding (Qwen2.5-0.5B, Llama-3.2-1B) stays one parameter: the embedding's
  rows and the head's output rows are the same `Shard(0)` rows, so the head takes the embedding's
  DTensor back after both are parallelized, and both uses add into one gradient.

Between blocks the residual stream is a DTensor sharded along the sequence, so the model's own
code (position ids, masks: it reads the full length from the DTensor's shape) runs unchanged.
The parameters become DTensors on the "tp" mesh; FSDP2 then shards them again over its own
dimension. A model must be parallelized after any wrapper that renames modules (activation
checkpointing's `_checkpoint_wrapped_module` is looked through) and before FSDP2.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any

from torch import nn

from ditty.config.errors import RecipeError
from ditty.parallel.tp_table import STYLES, TP_MODEL_TYPES, tp_plan_of

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.device_mesh import DeviceMesh

WRAPPERS = ("_checkpoint_wrapped_module.", "_orig_mod.")
"""Path parts that activation checkpointing and compile insert; plans name modules without them."""


def apply_tensor_parallel(model: nn.Module, tp_mesh: "DeviceMesh") -> nn.Module:
    """Parallelize a causal LM of TP_MODEL_TYPES in place over `tp_mesh` (see the module doc)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from ditty.parallel.tp_table import vocabulary_rows

    config = check_tensor_parallel_model(model)
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    vocab, tp = model.get_input_embeddings().weight.shape[0], tp_mesh.size()
    if vocabulary_rows(vocab, tp)[-1] == 0:
        raise RecipeError.single(
            f"= {tp} leaves a rank without a row of the model's {vocab}-token vocabulary",
            key="parallel.tp",
            fix="choose a smaller tp",
        )
    plan = tp_plan_of(config)
    unknown = sorted(set(plan.values()) - set(STYLES))
    if unknown:
        raise RecipeError.single(
            f"the {config.model_type} config's tensor-parallel plan has styles ditty does not apply: {unknown}",
            key="parallel.tp",
            fix="use tp = 1 with this model",
        )
    styles: dict[str, Any] = {}
    containers: set[str] = set()
    for name, _ in base.named_modules():
        clean = _clean(name)
        style = next((s for pattern, s in plan.items() if _matches(clean, pattern)), None)
        if style is None:
            continue
        if style == "colwise":
            styles[name] = ColwiseParallel()
        elif style == "rowwise":
            styles[name] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
            containers.add(name.rsplit(".", 1)[0])
        else:  # replicated_with_grad_allreduce: Qwen3's per-head norms on [batch, seq, heads, head_dim]
            styles[name] = SequenceParallel(sequence_dim=2, use_local_output=True)
    if not containers:
        raise RecipeError.single(
            f"the tensor-parallel plan of {config.model_type} matched no module of the model",
            key="parallel.tp",
            fix="use tp = 1 with this model",
        )
    layers = {container.rsplit(".", 1)[0] for container in containers}
    for container in containers:
        if _clean(container).endswith("self_attn"):  # called with hidden_states=... as a keyword
            styles[container] = PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            )
        else:
            styles[container] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    for layer in layers:
        for child_name, child in base.get_submodule(layer).named_children():
            if _is_norm(child):
                styles[f"{layer}.{child_name}"] = SequenceParallel(use_local_output=False)
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embeddings.weight
    names = {id(module): name for name, module in base.named_modules()}
    styles[names[id(embeddings)]] = RowwiseParallel(
        input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
    )
    final_norm = getattr(base, "norm", None)
    if final_norm is not None:
        styles[names[id(final_norm)]] = SequenceParallel(use_local_output=False)
    parallelize_module(base, tp_mesh, styles)
    if head is None:  # a sequence classifier (the reward model): its score head reads every token
        score = sequence_score_head(model)
        parallelize_module(score, tp_mesh, SequenceParallel(use_local_output=False))
        score.register_forward_hook(_whole_scores)
        return model
    parallelize_module(
        head, tp_mesh, ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    )
    if tied:
        # The embedding's vocabulary rows are the head's output rows, both Shard(0) on the "tp" mesh:
        # the head takes the embedding's DTensor back, so the two stay one parameter (one gradient).
        head.weight = embeddings.weight
    head.register_forward_hook(_whole_logits_outside_training)
    return model


def _whole_logits_outside_training(module: nn.Module, inputs: Any, output: Any) -> Any:
    """Evaluation and generation get plain logits, gathered over the vocabulary (transformers' sampling
    mixes them with plain tensors); in training they stay sharded for the loss."""
    if module.training:
        return output
    from torch.distributed.tensor import DTensor

    return output.full_tensor() if isinstance(output, DTensor) else output


def _whole_scores(module: nn.Module, inputs: Any, output: Any) -> Any:
    """A sequence classifier's scores, every token's, as a plain tensor on every rank: transformers then
    reads each row at its last token that is not padding, wherever it lies in the sequence."""
    from torch.distributed.tensor import DTensor

    return output.full_tensor() if isinstance(output, DTensor) else output


def sequence_score_head(model: nn.Module) -> "nn.Module | None":
    """The `score` Linear of a transformers sequence classifier (LlamaForSequenceClassification and its
    kin: a few outputs per token, read at each row's last token), else None."""
    score = getattr(model, "score", None)
    return score if isinstance(score, nn.Linear) else None


def check_tensor_parallel_model(model: nn.Module) -> Any:
    """The model's transformers config when ditty can split it (a causal LM of TP_MODEL_TYPES, tied or
    untied, or a sequence classifier of those families); else the RecipeError the compiler raises for
    recipes it can read offline."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    heads = callable(getattr(model, "get_output_embeddings", None)) and (
        model.get_output_embeddings() is not None or sequence_score_head(model) is not None
    )
    if model_type not in TP_MODEL_TYPES or not heads:
        raise RecipeError.single(
            f"ditty has tensor- and context-parallel plans for {', '.join(TP_MODEL_TYPES)} causal LMs (and their "
            f"sequence classifiers under tp), and this model is {model_type or type(model).__name__}",
            key="parallel.tp",
            fix="use a model of those families, or tp = cp = 1 (fsdp shards any model)",
        )
    return config


def _clean(name: str) -> str:
    for part in WRAPPERS:
        name = name.replace(part, "")
    return name


def _matches(name: str, pattern: str) -> bool:
    """A plan pattern ("layers.*.self_attn.q_proj") against a module path; "*" is one path part."""
    return name.count(".") == pattern.count(".") and fnmatch.fnmatchcase(name, pattern)


def _is_norm(module: nn.Module) -> bool:
    return type(module).__name__.endswith(("RMSNorm", "LayerNorm"))
