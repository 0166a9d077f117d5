"""Optimizers and learning-rate schedules built from `[optimizer]` and `[scheduler]`.

Importing this package is cheap (no torch until something is built), so the recipe compiler can
call `check_optimizer` and `check_scheduler`.
"""

from ditty.optim.optimizer import build_optimizer, check_optimizer, param_groups
from ditty.optim.scheduler import LRShape, build_scheduler, check_scheduler, lr_shape

__all__ = [
    "LRShape",
    "build_optimizer",
    "build_scheduler",
    "check_optimizer",
    "check_scheduler",
    "lr_shape",
    "param_groups",
]
