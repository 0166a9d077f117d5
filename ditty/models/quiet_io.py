"""transformers' progress bars for loading and saving one model ("Loading weights", "Writing model
shards") hidden unless verbose: they pass in a blink for the models ditty trains on a CPU and fill
the screen with carriage returns. Only those two: downloads keep huggingface_hub's bars, and the
data's bars are datasets'. transformers' public hook (`set_tqdm_hook`) picks them by description.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ditty._utils.quiet import verbose

QUIET_BARS = ("Loading weights", "Writing model shards")


@contextlib.contextmanager
def model_bars_quiet() -> Iterator[None]:
    """QUIET_BARS drawn as nothing for the code inside, unless verbose; the previous hook after."""
    from transformers.utils import logging as hf_logging

    set_hook = getattr(hf_logging, "set_tqdm_hook", None)
    if verbose() or set_hook is None:  # an older transformers without the hook draws its bars
        yield
        return

    def hook(factory: Any, args: tuple, kwargs: dict) -> Any:
        if kwargs.get("desc") in QUIET_BARS:
            return hf_logging.EmptyTqdm(*args, **kwargs)  # iterates, draws nothing
        return previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)

    previous = set_hook(hook)
    try:
        yield
    finally:
        set_hook(previous)
