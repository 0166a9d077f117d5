"""Cross-entropy straight from the final hidden states and the output projection, in chunks of
tokens, so the `[tokens, vocab]` logits and their gradient never exist at once.

For a Llama-3 vocabulary (128,256) and 8,192 tokens the full fp32 logits are 4.2 GB, and the usual
path holds them, their log-softmax and their gradient. Here each chunk of tokens is projected,
its loss summed and, while the chunk's logits are still at hand, the gradients with respect to the
hidden states and the projection weight are accumulated (as Liger Kernel's fused linear
cross-entropy does): the backward only scales those by the incoming gradient. Peak extra memory is
one chunk of logits plus a weight-sized fp32 gradient buffer; the matrix products are the same
three a full-logits step runs (no recompute), so throughput does not drop.

Backends (kernels.py): "chunked" (pure PyTorch, any device), "liger" (liger-kernel's Triton
kernel) and "cce" (Apple's cut-cross-entropy), the last two on CUDA only. Every backend returns the SUM of
the per-token losses and the token count, so the trainer's per-token normalisation over the global
batch is unchanged (ditty/stages/loss.py).

How the hidden states get here (head.py): `emit_head_input(model)` switches the model's output projection
(`get_output_embeddings()`) to hand its input through instead of projecting it, for one forward;
`run_pipeline` puts that input in the context under HEAD_INPUT and the loss projects it. The
projection module is still called by the model's own forward, so the hooks of FSDP2 (which gathers
a sharded head there and keeps it gathered until backward), DDP and DeepSpeed run as usual.

This package holds the loss calculator; torch is imported inside functions so the recipe compiler
can import it cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

from ditty._utils.labels import SHIFTED_LABELS
from ditty.stages.fused_loss.head import (
    Projection,
    emit_head_input,
    head_projection,
    model_config,
    output_head,
    replicated,
    unwrap,
)
from ditty.stages.fused_loss.kernels import (
    BACKENDS,
    GPU_BACKENDS,
    backend_installed,
    fused_linear_cross_entropy,
    half_dtype,
    resolve_backend,
)
from ditty.stages.loss import IGNORE_INDEX, LossCalculator, LossOutput, shifted_labels

# The model types the chunked loss is verified for: one table in ditty.stages.verified (packing uses it too).
from ditty.stages.verified import VERIFIED_MODEL_TYPES
from ditty.stages.vocab_parallel import sharded_linear_cross_entropy, tensor_parallel_rows

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "BACKENDS",
    "GPU_BACKENDS",
    "HEAD_INPUT",
    "VERIFIED_MODEL_TYPES",
    "FusedLinearCrossEntropyLoss",
    "Projection",
    "backend_installed",
    "emit_head_input",
    "fused_linear_cross_entropy",
    "head_projection",
    "output_head",
    "resolve_backend",
    "shifted",
    "wants_head_input",
]

HEAD_INPUT = "head_input"
"""Context key of the hidden states that went into the output projection."""


class FusedLinearCrossEntropyLoss(LossCalculator):
    """Cross-entropy from hidden states and the output projection, never holding the full logits.

    Causal LM (the default, what `[train] loss_chunks` builds): the hidden states are the input of the
    model's output head (`emit_head_input`, set up by the trainer for this loss), the projection is
    the head itself (`get_output_embeddings()`: nn.Linear, LoRA-wrapped, FSDP2-sharded, tied or
    not), and `labels` are unshifted (Hugging Face convention: position t predicts label t + 1).

    Custom models (the original Ditty call): `hidden_index` names the hidden states in the model's
    output, `weight_index` / `bias_index` the projection weight and bias there, or
    `weight_attr_path` / `bias_attr_path` attributes of the model ("lm_head.weight"); targets are
    then `ctx[target_key]` aligned with the hidden states unless `shift`.

    Returns the per-token SUM and the token count, like CausalLMLoss, so the trainer normalises over
    the whole global batch. `backend`: "auto" (liger, else cce when installed and on CUDA, else
    chunked), "chunked", "liger" or "cce"; `chunks`: how many pieces the tokens of a micro-batch
    are cut into by the chunked backend (more pieces, less memory, smaller matrix products).
    """

    def __init__(
        self,
        hidden_index: Union[int, str, None] = None,
        weight_index: Union[int, str, None] = None,
        bias_index: Union[int, str, None] = None,
        backend: str = "auto",
        ignore_index: int = IGNORE_INDEX,
        weight_attr_path: Optional[str] = None,
        bias_attr_path: Optional[str] = None,
        *,
        chunks: int = 8,
        target_key: str = "labels",
        mask_key: Optional[str] = None,
        shift: Optional[bool] = None,
        contract: Optional[str] = None,
    ) -> None:
        super().__init__(hidden_index if hidden_index is not None else 0, target_key, mask_key, contract=contract)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        if chunks < 1:
            raise ValueError(f"chunks must be at least 1, got {chunks}")
        self.hidden_index = hidden_index
        self.weight_index = weight_index
        self.bias_index = bias_index
        self.backend = backend
        self.ignore_index = ignore_index
        self.weight_attr_path = weight_attr_path
        self.bias_attr_path = bias_attr_path
        self.chunks = chunks
        self.shift = target_key == "labels" if shift is None else shift

    @property
    def uses_head_input(self) -> bool:
        """True when the hidden states come from the model's output head (see emit_head_input)."""
        return self.hidden_index is None

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        hidden = self.hidden_states(model_output, ctx)
        already_shifted = self.shift and shifted_labels(ctx) is not None
        target = shifted_labels(ctx) if already_shifted else self.get_target(ctx)
        mask = self.get_mask(ctx)
        if mask is not None:
            target = target.masked_fill(~mask.bool().to(target.device), self.ignore_index)
        if self.shift and not already_shifted:
            target = shifted(target, self.ignore_index)
        projection = self.projection(model_output, ctx)
        if tensor_parallel_rows(projection.weight):  # the head is split by vocabulary rows (tensor parallel)
            total, count = sharded_linear_cross_entropy(
                hidden,
                projection.weight,
                projection.bias,
                target,
                scale=projection.scale,
                softcap=projection.softcap,
                ignore_index=self.ignore_index,
                chunks=self.chunks,
            )
            return LossOutput(loss=total, num_tokens=count)
        backend = resolve_backend(self.backend, hidden.device.type, half_precision=half_dtype(hidden) is not None)
        total, count = fused_linear_cross_entropy(
            hidden, projection, target, ignore_index=self.ignore_index, chunks=self.chunks, backend=backend
        )
        return LossOutput(loss=total, num_tokens=count)

    def count_tokens(self, batch: Mapping) -> "Tensor":
        """Supervised tokens of a batch before its forward (the trainer's global-batch denominator)."""
        if self.shift and SHIFTED_LABELS in batch:
            target = batch[SHIFTED_LABELS]
            if self.mask_key and self.mask_key in batch:
                target = target.masked_fill(~batch[self.mask_key].bool(), self.ignore_index)
            return (target != self.ignore_index).sum()
        target = batch[self.target_key]
        if self.mask_key and self.mask_key in batch:
            target = target.masked_fill(~batch[self.mask_key].bool(), self.ignore_index)
        return ((target[..., 1:] if self.shift else target) != self.ignore_index).sum()

    def hidden_states(self, model_output: Any, ctx: Mapping) -> "Tensor":
        if self.hidden_index is None:
            hidden = ctx.get(HEAD_INPUT)
            if hidden is None:
                raise KeyError(
                    f"{type(self).__name__}: no {HEAD_INPUT!r} in the context; the model must run under "
                    "ditty.fused_loss.emit_head_input (the trainer does this), or set hidden_index"
                )
            return hidden
        return self.get_prediction(model_output)

    def projection(self, model_output: Any, ctx: Mapping) -> Projection:
        model = ctx.get("model")
        if self.weight_index is not None or self.weight_attr_path is not None:
            weight = self._pick(model_output, model, self.weight_index, self.weight_attr_path)
            bias = None
            if self.bias_index is not None or self.bias_attr_path is not None:
                bias = self._pick(model_output, model, self.bias_index, self.bias_attr_path, optional=True)
            return Projection(replicated(weight), replicated(bias))
        if model is None:
            raise KeyError(f"{type(self).__name__}: no 'model' in the context to take the output head from")
        return head_projection(output_head(model), model_config(model), keep_vocab_shards=True)

    def _pick(self, output: Any, model: Any, index: Any, path: Optional[str], optional: bool = False) -> Any:
        if index is not None:
            saved, self.output_index = self.output_index, index
            try:
                return self.get_prediction(output)
            except IndexError:
                if optional:
                    return None
                raise
            finally:
                self.output_index = saved
        obj = unwrap(model)
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj


def shifted(labels: "Tensor", ignore_index: int = IGNORE_INDEX) -> "Tensor":
    """Labels moved one position left (position t is scored on label t + 1), the last one ignored:
    aligned with every hidden state, so the hidden states need no slicing copy."""
    import torch

    pad = torch.full_like(labels[..., :1], ignore_index)
    return torch.cat([labels[..., 1:], pad], dim=-1)


def wants_head_input(loss: Any) -> bool:
    """Whether a loss (or a part of a composite loss) reads the output head's input."""
    if getattr(loss, "uses_head_input", False):
        return True
    return any(wants_head_input(part) for part, _ in getattr(loss, "parts", ()))
