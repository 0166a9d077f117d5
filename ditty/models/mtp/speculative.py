"""Greedy decoding with the MTP heads as drafts and the model as verifier: the model's own greedy
output, in fewer forwards of the model.

Each round, with the model's KV cache holding every verified position but the last token:
1. draft: depth 1 at the last verified position reads its trunk state and the embedding of the token
   just chosen, and drafts the one after; depth k reads depth k - 1's state and the draft before
   (DeepSeek-V3's sequential MTP). The heads' blocks attend over their stream from the first position,
   recomputed each round (one block per depth over the sequence; they keep no KV cache);
2. verify: one forward of the model over the last token and the drafts gives its greedy token after
   each; drafts are accepted while they equal it, and the model's token after the last accepted one
   comes free. The cache is cut back to the accepted positions.
Every token emitted is the model's greedy choice after the true prefix, so the text is greedy
decoding's (up to floating-point ties: a block of positions computes the same logits as one position
at a time, in another order of additions). One sequence at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ditty._utils.modules import unwrap
from ditty.models.mtp.heads import MTPHeads, text_config


@dataclass
class DecodeStats:
    new_tokens: int = 0
    model_forwards: int = 0
    """Forwards of the model (the prefill included)."""
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@torch.no_grad()
def greedy_decode(
    model: Any,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos_token_id: Optional[int],
    heads: Optional[MTPHeads] = None,
) -> tuple[list[int], DecodeStats]:
    """The greedy continuation of `prompt_ids` (cut after its first `eos_token_id`, which it keeps),
    drafted by `heads` when given, else one token per forward of the model (the same loop, for
    comparison)."""
    from transformers import DynamicCache

    base = unwrap(model, peft=True)
    device = base.get_input_embeddings().weight.device
    stats = DecodeStats()
    trunk: list[torch.Tensor] = []  # the output head's input of every forward: the trunk's states
    hook = base.get_output_embeddings().register_forward_pre_hook(lambda module, args: trunk.append(args[0]))
    try:
        cache = DynamicCache(config=base.config)
        logits = base(input_ids=torch.tensor([prompt_ids], device=device), cache=cache, use_cache=True).logits
        stats.model_forwards += 1
        states = trunk.pop()
        tokens = list(prompt_ids) + [int(logits[0, -1].argmax())]
        new = [tokens[-1]]
        drafter = Drafter(heads, base, tokens, len(prompt_ids) + max_new_tokens) if heads is not None else None
        while len(new) < max_new_tokens and new[-1] != eos_token_id:
            room = max_new_tokens - len(new) - 1  # the verifying forward adds one token of its own
            drafts = drafter.draft(states, room) if drafter is not None and room > 0 else []
            trunk.clear()  # the drafts' own calls of the head
            block = torch.tensor([[tokens[-1], *drafts]], device=device)
            logits = base(input_ids=block, cache=cache, use_cache=True).logits
            stats.model_forwards += 1
            greedy = logits[0].argmax(-1).tolist()
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == greedy[accepted]:
                accepted += 1
            stats.drafted += len(drafts)
            stats.accepted += accepted
            states = torch.cat([states, trunk.pop()[:, : accepted + 1]], dim=1)
            excess = cache.get_seq_length() - states.shape[1]
            if excess:
                cache.crop(-excess)
            chosen = drafts[:accepted] + [greedy[accepted]]
            tokens += chosen
            new += chosen
            if drafter is not None:
                drafter.extend(chosen)
    finally:
        hook.remove()
    if eos_token_id in new:
        new = new[: new.index(eos_token_id) + 1]
    new = new[:max_new_tokens]
    stats.new_tokens = len(new)
    return new, stats


class Drafter:
    """The heads' drafts during one decode: the embeddings of the tokens so far, the rotary embeddings
    of every position it may reach (computed once) and, for attention kernels that need one (eager),
    the causal mask."""

    def __init__(self, heads: MTPHeads, base: Any, tokens: list[int], longest: int) -> None:
        self.heads, self.base = heads, base
        self.embed, self.head = base.get_input_embeddings(), base.get_output_embeddings()
        self.device = self.embed.weight.device
        self.embeddings = self.embed(torch.tensor([tokens], device=self.device))
        positions = torch.arange(longest + heads.depth, device=self.device)[None]
        reference = self.embeddings.new_zeros(1, positions.shape[1], self.embeddings.shape[-1])
        self.rotary = base.get_decoder().rotary_emb(reference, position_ids=positions)
        # sdpa and the flash kernels make a mask-free call causal themselves
        self.needs_mask = base.config._attn_implementation not in ("sdpa", "flash_attention_2", "flash_attention_3")

    def extend(self, tokens: list[int]) -> None:
        more = self.embed(torch.tensor([tokens], device=self.device))
        self.embeddings = torch.cat([self.embeddings, more], dim=1)

    def draft(self, states: torch.Tensor, limit: int) -> list[int]:
        """One draft per depth (at most `limit`) after the tokens so far, from the trunk's `states` at
        every position but the last token's (see the module doc)."""
        length = states.shape[1]
        positions = torch.arange(length, device=self.device)[None]
        rotary = tuple(part[:, :length] for part in self.rotary)
        mask = None
        if self.needs_mask:
            from transformers.masking_utils import create_causal_mask

            config = text_config(self.base)
            mask = create_causal_mask(
                config=config, inputs_embeds=states, attention_mask=None, cache=None, position_ids=positions
            )
        embeddings, hidden, drafts = self.embeddings, states, []
        for k, layer in enumerate(list(self.heads.layers)[:limit], start=1):
            ahead = embeddings[:, k : k + length]
            hidden = layer(
                ahead, hidden, position_embeddings=rotary, attention_mask=mask, position_ids=positions, cache=None
            )
            token = int(self.head(hidden[:, -1:])[0, -1].argmax())
            drafts.append(token)
            embeddings = torch.cat([embeddings, self.embed(torch.tensor([[token]], device=self.device))], dim=1)
        return drafts
