"""The MTP heads: one transformers `MtpLayer` per depth, attached to the model they draft for.

Depth k reads the hidden state of depth k - 1 (the trunk's for k = 1) and the embedding of the token
k ahead, RMS-normalises each (`hnorm`, `enorm`), concatenates and projects them (`eh_proj`), runs one
decoder block of the model's own family (`mtp_block`) and normalises the result (`post_norm`); the
model's output head turns it into logits for the token k + 1 ahead. The parameter names are
transformers' (its MtpModel loads the same layout for `generate(use_mtp=True)`).

The heads are a submodule of the Hugging Face model, `ditty_mtp`, so everything the trainer does with
parameters covers them with no other path: the optimizer, gradient clipping, DDP's averaging, FSDP2's
sharding (each head's block is a block like the trunk's), checkpoints and their resume. The model's
forward never calls them: the MTP loss does, after the forward, on what the trunk left behind
(ditty.models.mtp.capture). They are attached after the adapter, so under LoRA they train in full.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ditty._utils.modules import unwrap
from ditty.models.mtp.capture import TrunkCapture, TrunkPass
from ditty.models.mtp.support import NATIVE_MTP_TYPES

MTP_MODULE = "ditty_mtp"
"""The heads' name on the Hugging Face model (state-dict keys `ditty_mtp.layers.{k}.*`)."""


class MTPHeads(nn.Module):
    """The depth modules (`layers`, an nn.ModuleList of MtpLayer) and the trunk capture they read."""

    def __init__(self, layers: nn.ModuleList, native: bool) -> None:
        super().__init__()
        self.layers = layers
        self.native = native
        """Built as transformers' MtpModel builds a model type that ships MTP layers (support.py)."""
        self.capture = TrunkCapture()

    @property
    def depth(self) -> int:
        return len(self.layers)


def heads_of(model: Any) -> Optional[MTPHeads]:
    """The MTP heads of a (DDP-, compile- or PEFT-wrapped) model, or None."""
    return getattr(unwrap(model, peft=True), MTP_MODULE, None)


def text_config(model: Any) -> Any:
    return unwrap(model, peft=True).config.get_text_config(decoder=True)


def is_native(model: Any) -> bool:
    """Whether the model's architecture ships MTP layers (their checkpoint names are its own)."""
    return getattr(text_config(model), "model_type", None) in NATIVE_MTP_TYPES


def build_heads(model: Any, depth: int) -> MTPHeads:
    """`depth` freshly initialised heads for `model` (a transformers causal LM), on its device and in
    the dtype of its input embedding (a quantized trunk's heads are not quantized)."""
    base = unwrap(model, peft=True)
    if is_native(base):
        from transformers.modeling_layers import MtpModel

        # transformers' own builder for these families (its MoE block, first_k_dense_replace = 0);
        # only its layers are kept: the embedding, head and rotary it ties are the model's own.
        layers = MtpModel(base, depth).layers
    else:
        from transformers.modeling_layers import MtpLayer

        config = text_config(base)
        last = base.get_decoder().layers[-1]
        # Built at the last trunk block's index: the same attention kind (full or sliding), so the mask
        # and rotary embeddings that block takes fit the heads' blocks too.
        index = config.num_hidden_layers - 1
        layers = torch.nn.ModuleList(
            [MtpLayer(config, type(last), norm_class(last), index, use_post_norm=True) for _ in range(depth)]
        )
    with torch.no_grad():
        for module in layers.modules():
            # The family's initialisation, as for its own new layers (MtpModel's generic one leaves an
            # MoE block's fused expert tensors as allocated: uninitialised memory).
            base._init_weights(module)
    reference = base.get_input_embeddings().weight
    layers.to(device=reference.device, dtype=reference.dtype)
    return MTPHeads(layers, native=is_native(base))


def norm_class(block: nn.Module) -> type:
    """The family's RMSNorm class, from its decoder block (as transformers' MtpModel finds it)."""
    for name, module in block.named_modules():
        if "norm" in name and callable(getattr(module, "forward", None)):
            return type(module)
    raise TypeError(f"{type(block).__name__} has no norm layer for the MTP heads to use")


def attach_heads(model: Any, heads: MTPHeads) -> Any:
    """Register the heads on the Hugging Face model inside any wrappers, and start recording the
    trunk's scored passes for them (ditty.models.mtp.capture)."""
    base = unwrap(model, peft=True)
    base.add_module(MTP_MODULE, heads)
    heads.capture.install(base.get_input_embeddings(), base.get_decoder().layers[-1], base.get_output_embeddings())
    return model


def run_depths(heads: MTPHeads, trunk: TrunkPass, *, trunk_gradient: bool = True) -> list[torch.Tensor]:
    """The hidden states of every depth, [batch, length, hidden] each, position i of depth k drafting
    the token at i + k + 1. Past the end of a row the embeddings ahead are zeros: the targets there are
    ignored, and causal attention keeps them from earlier positions (ditty.models.mtp.targets says why
    a packed row needs nothing more). `trunk_gradient` false detaches the trunk's outputs."""
    hidden, embeddings = trunk.hidden, trunk.embeddings
    if not trunk_gradient:
        hidden, embeddings = hidden.detach(), embeddings.detach()
    device, enabled, dtype = trunk.autocast
    kwargs = {"position_embeddings": None, "attention_mask": None, "position_ids": None, **trunk.block_kwargs}
    out = []
    with torch.autocast(device, dtype=dtype, enabled=enabled):
        for k, layer in enumerate(heads.layers, start=1):
            ahead = tokens_ahead(embeddings, k)
            hidden = layer(ahead, hidden, cache=None, **kwargs)
            out.append(hidden)
    return out


def tokens_ahead(embeddings: torch.Tensor, k: int) -> torch.Tensor:
    """[batch, length, hidden] embeddings moved k positions left, zeros past the row's end."""
    length = embeddings.shape[1]
    tail = embeddings.new_zeros(embeddings.shape[0], min(k, length), embeddings.shape[2])
    return torch.cat([embeddings[:, k:], tail], dim=1)
