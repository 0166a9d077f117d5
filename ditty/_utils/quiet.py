"""Library noise kept off the screen unless `--verbose` (or DITTY_VERBOSE=1) asks for it.

Each entry of NOISY_LOGGERS is a logger whose messages below ERROR say nothing a ditty user can act
on: torchao's optional CUDA kernels that fail to load on a CPU build ("Failed to load
..._C_mxfp8..."), torch's pytree deprecation notice for torchao's enums, DeepSpeed's "Setting
accelerator to CPU", bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community"
(an optional hub kernel on CPUs with AVX-512 BF16), and transformers' per-tensor LOAD REPORT tables
(ditty reports a new classifier head itself). A filter on the logger, not a level: DeepSpeed sets
its logger's level when imported, which would undo a level set before; filters survive that. A
filter acts on the logger that makes the record, so each entry is that logger's full name. Errors
still show.

KNOWN_WARNINGS are Python warnings that ditty's own calls into a library trigger and a user cannot
act on (peft asks a transformers model `is_gradient_checkpointing`, deprecated in transformers 5).
The command line ignores them for the whole process; the Python API only around its own calls.
transformers' own progress bars are ditty.models.quiet_io's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Iterator

NOISY_LOGGERS = (
    "torchao",
    "torch.utils._pytree",
    "DeepSpeed",
    "bitsandbytes.backends.cpu.ops",
    "transformers.modeling_utils",
    "transformers.utils.loading_report",
)
KNOWN_WARNINGS = ((FutureWarning, r"`is_gradient_checkpointing` is deprecated"),)
"""(category, message regex): warnings raised inside libraries by calls ditty makes."""
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


def ignore_known_warnings() -> None:
    """KNOWN_WARNINGS ignored for the rest of the process (the command line's), unless verbose."""
    if verbose():
        return
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


@contextlib.contextmanager
def known_warnings_ignored() -> Iterator[None]:
    """KNOWN_WARNINGS ignored inside (the Python API's calls), the caller's filters as they were after."""
    with warnings.catch_warnings():
        ignore_known_warnings()
        yield
