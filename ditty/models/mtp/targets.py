"""Each depth's targets: the labels k further ahead, within the sample that asks for them.

Labels are unshifted (Hugging Face convention, ditty/data/collate.py): the main head at position t is
scored on labels[t + 1]; depth k at t on labels[t + 1 + k], ignored where that label is ignored (a
prompt, padding: masked like the main labels) and where t and t + 1 + k lie in different samples of a
packed row. Samples are told apart by their position ids, which restart at 0 for each packed sample
(a padded row is one sample). So no target crosses a document boundary, and since a position whose
inputs reach into the next sample (its embedding k ahead) only feeds later positions of its own
sample, whose targets lie further still, nothing of one sample reaches another's loss: the same
result as torchtitan's `roll_mtp_sequence` rolling each document, without moving any tensor.
"""

from __future__ import annotations

from typing import Optional

import torch

from ditty._utils.labels import IGNORE_INDEX


def sample_ids(position_ids: Optional[torch.Tensor], shape: torch.Size, device: torch.device) -> torch.Tensor:
    """[batch, length] index of the packed sample each position belongs to (0 for an unpacked row)."""
    if position_ids is None:
        return torch.zeros(shape, dtype=torch.long, device=device)
    return (position_ids == 0).long().cumsum(dim=-1)


def depth_targets(
    labels: torch.Tensor, position_ids: Optional[torch.Tensor], depth: int, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """[batch, length] targets of depth `depth` (1 = the token after the next) aligned with every
    position, `ignore_index` where there is none (see the module doc)."""
    shift = 1 + depth
    targets = torch.full_like(labels, ignore_index)
    if labels.shape[-1] <= shift:
        return targets
    samples = sample_ids(position_ids, labels.shape, labels.device).to(labels.device)
    same = samples[:, :-shift] == samples[:, shift:]
    targets[:, :-shift] = labels[:, shift:].masked_fill(~same, ignore_index)
    return targets


def depth_counts(
    labels: torch.Tensor, position_ids: Optional[torch.Tensor], depth: int, ignore_index: int = IGNORE_INDEX
) -> list[torch.Tensor]:
    """Supervised targets of depths 1..depth in a batch (the global-batch denominators of the heads)."""
    return [(depth_targets(labels, position_ids, k, ignore_index) != ignore_index).sum() for k in range(1, depth + 1)]
