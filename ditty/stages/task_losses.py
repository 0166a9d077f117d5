"""The loss of the model tasks other than causal LM (ditty/models/tasks.py names it per task).

`LabelCrossEntropyLoss`: cross-entropy of the model's logits against `labels` at the same position,
not shifted: a classifier's [B, K] logits against [B] class ids, a token classifier's or masked LM's
[B, T, V] against [B, T] (-100 where nothing is scored), a seq2seq model's decoder logits against
the target ids (the decoder inputs are already the labels shifted right). Like `CausalLMLoss` it
returns the SUM over scored labels and their count, and says how to count them before the forward
(`count_tokens`), so the trainer divides by the scored labels of the whole global batch: any split
of a global batch gives the same loss and gradients, for a classifier that is the mean over samples.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

from ditty._utils.labels import IGNORE_INDEX
from ditty.stages.loss import CrossEntropyLoss, LossOutput, token_cross_entropy

if TYPE_CHECKING:
    from torch import Tensor


class LabelCrossEntropyLoss(CrossEntropyLoss):
    def __init__(
        self,
        output_index: Union[int, str] = "logits",
        target_key: str = "labels",
        *,
        ignore_index: int = IGNORE_INDEX,
        contract: Optional[str] = None,
    ) -> None:
        super().__init__(output_index, target_key, mask_key=None, ignore_index=ignore_index, contract=contract)

    def compute(self, model_output: Any, ctx: Mapping) -> LossOutput:
        total, count = token_cross_entropy(self.get_prediction(model_output), self.get_target(ctx), self.ignore_index)
        return LossOutput(loss=total, num_tokens=count)

    def count_tokens(self, batch: Mapping) -> "Tensor":
        """Scored labels of a batch before its forward (the trainer's global-batch denominator)."""
        return (batch[self.target_key] != self.ignore_index).sum()
