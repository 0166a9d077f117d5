"""What the MTP heads read from the trunk's forward, recorded by hooks as the forward runs.

Three module hooks, installed once when the heads are attached: the input embedding's output (the
embeddings of the tokens ahead, taken by shifting it: no second lookup, so a sharded embedding
is called once per step), the keyword arguments of the trunk's last decoder block (the attention
mask in whatever form the attention kernel takes, packed samples' lengths included, the rotary
embeddings and position ids: the heads' blocks attend exactly as the trunk's do), and the output
head's input (the final hidden states, after the trunk's final norm, as transformers' MtpModel reads
them). The hooks only record scored passes, those without a KV cache (training and evaluation
forwards): decoding steps leave nothing behind. The loss takes the record once and it is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import torch

DECODING_KEYS = ("cache", "past_key_values", "past_key_value", "use_cache")
"""Block arguments about the KV cache: a scored pass has none, and the heads never write the trunk's."""


@dataclass
class TrunkPass:
    """One scored forward of the trunk, as the heads need it."""

    hidden: "torch.Tensor"
    """[batch, length, hidden]: the output head's input."""
    embeddings: "torch.Tensor"
    """[batch, length, hidden]: the input embedding of every token."""
    block_kwargs: dict
    """The keyword arguments the last decoder block took, less the KV cache's."""
    autocast: tuple[str, bool, Any]
    """(device type, enabled, dtype) of the autocast the trunk ran under, for the heads' blocks."""


class TrunkCapture:
    """Records the last scored pass of the trunk (see the module doc)."""

    def __init__(self) -> None:
        self.embeddings: Optional[torch.Tensor] = None
        self.block_kwargs: Optional[dict] = None
        self.hidden: Optional[torch.Tensor] = None
        self.autocast: Any = None
        self.handles: list = []

    def install(self, embedding: "torch.nn.Module", last_block: "torch.nn.Module", head: "torch.nn.Module") -> None:
        self.remove()
        self.handles = [
            embedding.register_forward_hook(self._on_embeddings),
            last_block.register_forward_pre_hook(self._on_last_block, with_kwargs=True),
            head.register_forward_pre_hook(self._on_head),
        ]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _on_embeddings(self, module: Any, args: Any, output: "torch.Tensor") -> None:
        self.clear()
        self.embeddings = output

    def _on_last_block(self, module: Any, args: tuple, kwargs: dict) -> None:
        # Only the first call after the embeddings: activation checkpointing calls the block again
        # in the backward, after the loss took the record.
        if self.embeddings is None or self.block_kwargs is not None:
            return
        decoding = kwargs.get("use_cache") or any(kwargs.get(k) is not None for k in DECODING_KEYS[:3])
        if decoding or len(args) > 1:  # a positional argument past the hidden states: not a family ditty reads
            self.clear()
            return
        import torch

        hidden = args[0] if args else kwargs.get("hidden_states")
        device = hidden.device.type
        self.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        self.block_kwargs = {k: v for k, v in kwargs.items() if k not in DECODING_KEYS and k != "hidden_states"}

    def _on_head(self, module: Any, args: tuple) -> None:
        if self.block_kwargs is not None and self.hidden is None:
            self.hidden = args[0]

    def clear(self) -> None:
        self.embeddings = self.block_kwargs = self.hidden = self.autocast = None

    def take(self) -> TrunkPass:
        """The recorded pass, forgotten here (its tensors live on in the loss's graph only)."""
        if self.hidden is None or self.embeddings is None or self.block_kwargs is None:
            self.clear()
            raise RuntimeError(
                "the MTP heads found no scored pass of the trunk: the model must run a full forward without a "
                "KV cache (use_cache=False) right before the MTP loss"
            )
        recorded = TrunkPass(self.hidden, self.embeddings, self.block_kwargs, self.autocast)
        self.clear()
        return recorded
