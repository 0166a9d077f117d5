"""What tensor and context parallel change in the plan: which tensors tensor parallel splits and how
(ditty.parallel.tensor's layout: q/k/v and gate/up by output rows, o_proj and down_proj by input
columns, the embedding and the head by vocabulary rows, norms whole), and the bytes each rank sends
in their collectives per optimizer step.

Traffic per rank, per micro-batch and layer (tokens = the rank's slice of the micro-batch, a = bytes
per activation element; a ring collective sends (n - 1) / n of the gathered tensor from each rank):
- tensor parallel with sequence parallel: the forward all-gathers the attention's and the MLP's input
  and reduce-scatters their outputs, 4 collectives of [tokens, hidden]; the backward runs the same 4
  the other way; full activation checkpointing repeats the forward's;
- Ulysses context parallel: the forward's all-to-all sends q, k, v in and the output back (each
  [tokens, width / tp]); the backward sends their gradients; a rank keeps 1 / cp of each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from ditty.plan.architecture import ModelShape
from ditty.plan.settings import Settings

COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE = ("o_proj", "down_proj")
NVLINK_BYTES_PER_S = 450e9
"""One direction of an H100's NVLink 4 (900 GB/s both ways): the bandwidth the traffic time assumes,
for tensor- and context-parallel groups inside one node."""


def tp_split(name: str) -> Optional[Literal["rows", "columns"]]:
    """How tensor parallel cuts parameter `name`: by rows (dim 0), by columns, or not at all."""
    module, _, leaf = name.rpartition(".")
    last = module.rpartition(".")[2]
    if last in COLWISE or "embed_tokens" in module or module.endswith("lm_head"):
        return "rows"
    if last in ROWWISE and leaf == "weight":
        return "columns"
    return None


def tp_local(name: str, rows: int, per_row: int, tp: int, index: int = 0) -> tuple[int, int]:
    """(rows, elements per row) of tensor-parallel rank `index`'s piece of a [rows, per_row] tensor (rank
    0's, the largest, by default). Rows are cut as torch.chunk cuts them, so a vocabulary that tp does
    not divide leaves the last ranks shorter pieces (259 tokens at tp = 2: 130 and 129 rows)."""
    split = tp_split(name) if tp > 1 else None
    if split == "rows":
        piece = -(-rows // tp)
        return max(0, min(piece, rows - index * piece)), per_row
    if split == "columns":
        return rows, -(-per_row // tp)
    return rows, per_row


@dataclass(frozen=True)
class Traffic:
    tensor_parallel: int
    """Bytes each rank sends per optimizer step in tensor parallel's all-gathers and reduce-scatters."""
    context_parallel: int
    """Bytes each rank sends per optimizer step in Ulysses' all-to-alls."""

    @property
    def seconds_at_nvlink(self) -> float:
        return (self.tensor_parallel + self.context_parallel) / NVLINK_BYTES_PER_S


def traffic(shape: ModelShape, s: Settings) -> Traffic:
    """The collectives' bytes per rank per step (see the module doc); zero without tp / cp."""
    a = s.activation_bytes
    passes = 3 if s.activation_checkpointing == "full" else 2  # forward, backward, recomputed forward
    tp_bytes = cp_bytes = 0
    if s.tp > 1:
        per_layer = 2 * 2 * s.tokens * shape.hidden_size * a * (s.tp - 1) / s.tp  # 2 gathers + 2 scatters
        tp_bytes = int(per_layer * passes * shape.num_layers * s.accumulation)
    if s.cp > 1:
        kv = shape.kv_dim if shape.num_kv_heads % (s.tp * s.cp) == 0 else shape.q_dim  # repeated when too few
        widths = (2 * shape.q_dim + 2 * kv) / s.tp
        per_layer = s.tokens * widths * a * (s.cp - 1) / s.cp
        cp_bytes = int(per_layer * passes * shape.num_layers * s.accumulation)
    return Traffic(tp_bytes, cp_bytes)
