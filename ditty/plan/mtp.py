"""What `[mtp]` heads add to the plan: their parameters and the activations of their blocks.

Depth k's tensors (ditty.models.mtp.heads) are `enorm`, `hnorm` (hidden), `eh_proj` (hidden x 2
hidden), one decoder block shaped as the trunk's last and `post_norm`, under the names the trainer's
model gives them (`ditty_mtp.layers.{k}.*`). They are new weights, trained in full beside an adapter,
never quantized (ditty.plan.parameters). Each block is its own FSDP unit, as the trunk's are.

Activations: each depth keeps what one trunk block keeps (under the recipe's checkpointing, which
wraps the heads' blocks too), plus its own inputs: the two normalised inputs (fp32 input and
reciprocal RMS of each norm, as the trunk's norms keep them), the concatenation the projection keeps
for its weight's gradient, and the post-norm's. The heads' cross-entropy runs through the chunked loss,
one chunk of logits at a time, already counted by the loss row for the main head.
"""

from __future__ import annotations

from dataclasses import replace

from ditty.plan.architecture import ModelShape, TensorSpec

PREFIX = "ditty_mtp."
"""Names of the heads' tensors (ditty.models.mtp.heads.MTP_MODULE)."""
FP32 = 4


def is_head_tensor(name: str) -> bool:
    return name.startswith(PREFIX)


def with_heads(shape: ModelShape, depth: int) -> ModelShape:
    """`shape` with `depth` heads' tensors appended (the trainer attaches them last)."""
    if depth <= 0 or shape.num_layers < 1:
        return shape
    last = shape.num_layers - 1
    block = shape.block_tensors(last)
    marker = f"layers.{last}."
    h = shape.hidden_size
    tensors: list[TensorSpec] = []
    for k in range(depth):
        p = f"{PREFIX}layers.{k}."
        tensors += [
            TensorSpec(f"{p}enorm.weight", (h,), "norm"),
            TensorSpec(f"{p}hnorm.weight", (h,), "norm"),
            TensorSpec(f"{p}eh_proj.weight", (h, 2 * h), "linear"),
        ]
        # the block's own unit under FSDP, numbered after the trunk's
        tensors += [
            replace(t, name=f"{p}mtp_block.{t.name.split(marker, 1)[1]}", block=shape.num_layers + k) for t in block
        ]
        tensors.append(TensorSpec(f"{p}post_norm.weight", (h,), "norm"))
    return replace(shape, tensors=shape.tensors + tuple(tensors), extra={**shape.extra, "mtp_depth": depth})


def heads_activation_bytes(shape: ModelShape, kept_per_block: tuple[int, ...], tokens: int, weight_bytes: int) -> int:
    """Bytes the heads keep for the backward of one micro-batch (see the module doc)."""
    depth = int(shape.extra.get("mtp_depth", 0))
    if depth <= 0:
        return 0
    h = shape.hidden_size
    norms = 3 * (FP32 * h + FP32 + weight_bytes * h)  # enorm, hnorm, post_norm: fp32 input, 1/rms, output
    own = norms + weight_bytes * 2 * h  # the concatenation eh_proj keeps
    return depth * tokens * (sum(kept_per_block) + own)
