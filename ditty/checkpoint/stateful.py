"""`ModelOptimizerState`: model and optimizer state in a form that survives sharding changes.

`torch.distributed.checkpoint.state_dict.get_state_dict` names optimizer state by parameter name
instead of by position, and hands FSDP2 parameters over as DTensors, so the same checkpoint loads
into a plain module, a DDP module or an FSDP2 module on any number of ranks (DCP reshards).
Before the optimizer's first step it also creates the (zero) state tensors, which gives a fresh
optimizer something to load into.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)


class ModelOptimizerState:
    """A DCP `Stateful` over one model and, optionally, its optimizer.

    trainable_only: save and load only parameters with requires_grad (an adapter's weights);
    the frozen base stays whatever it was built as, so loading is not strict about it.
    keep_hyperparameters: loading restores the optimizer's state (moments, step counts) but leaves
    its hyperparameters (everything in a param group but its parameters: lr, betas, eps, weight
    decay, momentum) as the optimizer was built with them. The trainer builds its optimizer from
    the recipe, so this makes a resumed run follow the recipe's values, not the saved ones.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        trainable_only: bool = False,
        keep_hyperparameters: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.keep_hyperparameters = keep_hyperparameters
        self.options = StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model, options=self.options)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self.options)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load weights and optimizer state (see `keep_hyperparameters` for the param groups)."""
        if self.optimizer is None:
            set_model_state_dict(self.model, state_dict["model"], options=self.options)
            return
        built = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
            options=self.options,
        )
        if self.keep_hyperparameters:
            # Counters an optimizer keeps in its param groups (schedule-free's step count and weight
            # sum) are state, not hyperparameters: they stay as loaded.
            counters = set(getattr(self.optimizer, "group_state_keys", ()))
            for group, values in zip(self.optimizer.param_groups, built):
                group.update({k: v for k, v in values.items() if k not in counters})
