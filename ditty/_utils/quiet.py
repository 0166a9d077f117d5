"""Library start-up noise kept off the screen unless `--verbose` (or DITTY_VERBOSE=1) asks for it.

Each entry is a logger whose messages below ERROR say nothing a ditty user can act on: torchao's
optional CUDA kernels that fail to load on a CPU build ("Failed to load ..._C_mxfp8..."), torch's
pytree deprecation notice for torchao's enums, DeepSpeed's "Setting accelerator to CPU", and
transformers' per-tensor LOAD REPORT tables (ditty reports a new classifier head itself). A filter
on the logger, not a level: DeepSpeed sets its logger's level when imported, which would undo a
level set before; filters survive that. Errors still show.
"""

from __future__ import annotations

import logging
import os

NOISY_LOGGERS = (
    "torchao",
    "torch.utils._pytree",
    "DeepSpeed",
    "transformers.modeling_utils",
    "transformers.utils.loading_report",
)
VERBOSE_ENV = "DITTY_VERBOSE"
"""Set by `--verbose`; torchrun's workers inherit it with the environment."""


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


_FILTER = _BelowError()


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def quiet_libraries() -> None:
    """Filter the NOISY_LOGGERS' messages below ERROR, unless verbose; safe to call more than once
    and before the libraries are imported."""
    if verbose():
        return
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
