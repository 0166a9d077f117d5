"""Which models ditty splits with tensor and context parallel, how, and what must divide what.

Pure Python (no torch), so the recipe compiler checks a recipe's degrees against the model's sizes
before anything is built; `ditty.parallel.tensor` applies the plan with DTensor.

The plan of each family comes from the model config's own `base_model_tp_plan` where transformers
ships one (transformers 5 does for all four: q/k/v and gate/up "colwise", o_proj and down_proj
"rowwise", Qwen3's per-head q_norm/k_norm "replicated_with_grad_allreduce"), else from
DITTY_TP_PLANS, the same entries written down (tests/parallel/test_tp_table.py keeps the two
equal). ditty adds what those plans leave to the trainer: the embedding split by vocabulary rows,
sequence parallel for every RMSNorm, and the output head split by vocabulary with its logits left
sharded for the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

TP_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""The families ditty verifies under tensor and context parallel (tests/parallel/test_tensor_parallel.py)."""

_LLAMA_PLAN = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}
DITTY_TP_PLANS: dict[str, dict[str, str]] = {
    "llama": _LLAMA_PLAN,
    "mistral": _LLAMA_PLAN,
    "qwen2": _LLAMA_PLAN,
    "qwen3": {
        **_LLAMA_PLAN,
        "layers.*.self_attn.q_norm": "replicated_with_grad_allreduce",
        "layers.*.self_attn.k_norm": "replicated_with_grad_allreduce",
    },
}
"""Paths under the base model (`model.`) -> style, for configs that carry no `base_model_tp_plan`."""

STYLES = ("colwise", "rowwise", "replicated_with_grad_allreduce")
"""The plan entries ditty knows how to apply (transformers names them so)."""


def tp_plan_of(config: Any) -> dict[str, str]:
    """The base model's plan for a transformers config: its own `base_model_tp_plan`, else ditty's table."""
    own = getattr(config, "base_model_tp_plan", None)
    if own:
        return dict(own)
    return dict(DITTY_TP_PLANS.get(getattr(config, "model_type", None), {}))


@dataclass(frozen=True)
class ModelDims:
    """The sizes tensor and context parallel split, read from a model's config (a dict)."""

    model_type: Optional[str]
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    sliding_window: Optional[int]

    @classmethod
    def from_config(cls, values: dict[str, Any]) -> "ModelDims":
        heads = int(values["num_attention_heads"])
        window = values.get("sliding_window") if values.get("use_sliding_window", True) is not False else None
        return cls(
            model_type=values.get("model_type"),
            num_heads=heads,
            num_kv_heads=int(values.get("num_key_value_heads") or heads),
            intermediate_size=int(values["intermediate_size"]),
            vocab_size=int(values["vocab_size"]),
            tie_word_embeddings=bool(values.get("tie_word_embeddings", False)),
            sliding_window=int(window) if window else None,
        )


@dataclass(frozen=True)
class Mismatch:
    """One size the degrees do not divide: the recipe key to change, what, and how."""

    key: str
    message: str
    fix: str


def divisibility(dims: ModelDims, tp: int, cp: int, seq_len: int) -> list[Mismatch]:
    """Every size of `dims` (and the sequence length) that `tp` and `cp` do not divide.

    Tensor parallel splits the attention heads and the key/value heads (q/k/v colwise, o_proj rowwise),
    the MLP's width (gate/up colwise, down rowwise) and the vocabulary (embedding rows, output head).
    The vocabulary need not divide: its rows are cut as `torch.chunk` cuts them (259 tokens over 2 ranks:
    130 and 129), the loss and the log-probabilities reduce over uneven shards, and checkpoints and
    `final/` keep the model's own vocabulary; only a degree that leaves a rank no row is refused.
    The hidden size is not split: sequence parallel cuts the norms' activations along the sequence.
    Ulysses splits each tensor-parallel rank's query heads over the context ranks, so the heads must
    divide by tp x cp; key/value heads fewer than that are repeated before the all-to-all (the cost of
    GQA under Ulysses) and need no check. Rows are cut into cp equal pieces.
    """
    out: list[Mismatch] = []
    for what, size in (
        ("attention heads", dims.num_heads),
        ("key/value heads", dims.num_kv_heads),
        ("intermediate (MLP) size", dims.intermediate_size),
    ):
        if tp > 1 and size % tp:
            out.append(
                Mismatch(
                    "parallel.tp",
                    f"= {tp} does not divide the model's {what} ({size}): tensor parallel gives each rank an "
                    "equal share",
                    f"choose a tp that divides {size} ({_divisors(size)})",
                )
            )
    if tp > 1 and vocabulary_rows(dims.vocab_size, tp)[-1] == 0:
        fit = max(d for d in range(1, tp + 1) if vocabulary_rows(dims.vocab_size, d)[-1] > 0)
        out.append(
            Mismatch(
                "parallel.tp",
                f"= {tp} leaves a rank without a row of the vocabulary ({dims.vocab_size} tokens, cut as torch.chunk "
                f"cuts: {', '.join(map(str, vocabulary_rows(dims.vocab_size, tp)))} rows): every tensor-parallel rank "
                "takes part in the loss with its share of the output head",
                f"choose tp at most {fit}",
            )
        )
    if cp > 1 and dims.num_heads % (tp * cp):
        out.append(
            Mismatch(
                "parallel.cp",
                f"tp x cp = {tp * cp} does not divide the model's {dims.num_heads} attention heads: Ulysses gives "
                "each context rank a share of every tensor-parallel rank's heads",
                f"choose tp x cp dividing {dims.num_heads} ({_divisors(dims.num_heads)})",
            )
        )
    if cp > 1 and seq_len % cp:
        fit = -(-seq_len // cp) * cp
        out.append(
            Mismatch(
                "data.max_seq_len",
                f"= {seq_len} is not a multiple of cp = {cp}: each row is cut into cp equal pieces",
                f"set data.max_seq_len = {fit} (or {seq_len - seq_len % cp})",
            )
        )
    return out


def vocabulary_rows(vocab_size: int, tp: int) -> list[int]:
    """Rows of the embedding and the output head on each tensor-parallel rank: `torch.chunk`'s pieces,
    as DTensor's `Shard(0)` cuts them (pieces of ceil(vocab / tp) rows, the last ones shorter or empty)."""
    piece = -(-vocab_size // tp)
    return [max(0, min(piece, vocab_size - rank * piece)) for rank in range(tp)]


def _divisors(n: int) -> str:
    found = [d for d in range(2, min(n, 64) + 1) if n % d == 0]
    return "e.g. " + ", ".join(str(d) for d in found[:6]) if found else "only 1"
