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
        while len(new) < max_new_tokens and new[-1] != eos_token_id:
            room = max_new_tokens - len(new) - 1  # the verifying forward adds one token of its own
            drafts = draft(heads, base, tokens, states, room) if heads is not None and room > 0 else []
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
    finally:
        hook.remove()
    if eos_token_id in new:
        new = new[: new.index(eos_token_id) + 1]
    new = new[:max_new_tokens]
    stats.new_tokens = len(new)
    return new, stats


def draft(heads: MTPHeads, base: Any, tokens: list[int], states: torch.Tensor, limit: int) -> list[int]:
    """One draft per depth (at most `limit`) after `tokens`, from the trunk's `states` at every position
    but the last token's (see the module doc)."""
    from transformers.masking_utils import create_causal_mask

    length = states.shape[1]
    device = states.device
    embed = base.get_input_embeddings()
    head = base.get_output_embeddings()
    known = torch.tensor([tokens], device=device)
    embeddings = embed(known)
    positions = torch.arange(length, device=device)[None]
    decoder = base.get_decoder()
    rotary = decoder.rotary_emb(states, position_ids=positions)
    mask = create_causal_mask(
        config=text_config(base), inputs_embeds=states, attention_mask=None, cache=None, position_ids=positions
    )
    hidden, drafts = states, []
    for k, layer in enumerate(list(heads.layers)[:limit], start=1):
        ahead = embeddings[:, k : k + length]
        hidden = layer(
            ahead, hidden, position_embeddings=rotary, attention_mask=mask, position_ids=positions, cache=None
        )
        token = int(head(hidden[:, -1:])[0, -1].argmax())
        drafts.append(token)
        embeddings = torch.cat([embeddings, embed(torch.tensor([[token]], device=device))], dim=1)
    return drafts
