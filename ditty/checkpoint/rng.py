"""Random-number-generator state as plain JSON data: capture, restore, pick this rank's entry.

Exact resume needs every generator the training step draws from (dropout uses torch's, data
augmentation may use python's or numpy's) back in the state it had at the checkpoint. The states
are stored as JSON, not pickles, so a checkpoint can be read without trusting it:

- python: `random.getstate()` is (version, 625 ints, gauss_next): lists and ints.
- numpy: the legacy global `np.random` MT19937 state (624 uint32 words, position, cached gaussian).
  numpy is optional; a missing numpy is recorded as null.
- torch: the CPU generator state is a uint8 tensor (about 5 KB); it travels as base64 text.
- cuda: one base64 state per visible device, only when CUDA is initialised (querying it otherwise
  would initialise CUDA just to save a state nobody drew from).

Restore this rank's state last, after everything that may draw random numbers while being built
(model init, dataloader workers), or the resumed run starts from a different point of the stream.
"""

from __future__ import annotations

import base64
import logging
import random
from typing import Any, Mapping

import torch

log = logging.getLogger(__name__)

FORMAT = 1


def _encode_bytes(t: torch.Tensor) -> str:
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode("ascii")


def _decode_bytes(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def _numpy_state() -> dict | None:
    try:
        import numpy as np
    except ImportError:
        return None
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "bit_generator": name,
        "keys": [int(k) for k in keys],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _set_numpy_state(state: Mapping[str, Any] | None) -> None:
    if state is None:
        return
    try:
        import numpy as np
    except ImportError:
        log.warning("the checkpoint holds a numpy RNG state but numpy is not installed; skipped")
        return
    keys = np.asarray(state["keys"], dtype=np.uint32)
    np.random.set_state(
        (state["bit_generator"], keys, int(state["pos"]), int(state["has_gauss"]), float(state["cached_gaussian"]))
    )


def capture() -> dict[str, Any]:
    """This process's RNG states as JSON-serialisable data."""
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "format": FORMAT,
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": _numpy_state(),
        "torch": _encode_bytes(torch.get_rng_state()),
        "cuda": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_encode_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore(state: Mapping[str, Any]) -> None:
    """Put the generators back exactly as `capture()` found them."""
    if state.get("format") != FORMAT:
        raise ValueError(f"unknown RNG state format {state.get('format')!r} (this ditty reads {FORMAT})")
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    _set_numpy_state(state.get("numpy"))
    torch.set_rng_state(_decode_bytes(state["torch"]))
    cuda = state.get("cuda")
    if cuda:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
            torch.cuda.set_rng_state_all([_decode_bytes(s) for s in cuda])
        else:
            log.warning(
                "the checkpoint holds CUDA RNG states for %d devices; this process sees %d, so "
                "CUDA random streams (dropout on GPU) start fresh",
                len(cuda),
                torch.cuda.device_count() if torch.cuda.is_available() else 0,
            )


def restore_for_rank(states_by_rank: Mapping[str, Any], rank: int) -> bool:
    """Restore `rank`'s entry of a checkpoint's `rng` mapping (keys are rank numbers as text).

    Returns False, with a warning, when the checkpoint has no entry for this rank: a run resumed
    on more ranks than it was saved with. Per-rank streams cannot be re-split across a different
    world size, so that rank keeps its fresh seed (dropout differs; the data order does not, since
    it hangs on the global sample cursor, not on an RNG).
    """
    state = states_by_rank.get(str(rank))
    if state is None:
        log.warning(
            "checkpoint has RNG states for ranks %s but not for rank %d; that rank keeps its freshly seeded generators",
            sorted(states_by_rank, key=int),
            rank,
        )
        return False
    restore(state)
    return True
