"""The LambdaLR subclass ditty's schedules run on (imports torch: load it only to build one)."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


class ClosedFormLR(LambdaLR):
    """LambdaLR whose state is the step count alone, and which applies it when loaded.

    - state_dict leaves the shape out (LambdaLR would save LRShape's fields and let them
      override the recipe on resume): the recipe defines the shape, so a resumed run with more
      steps follows its new schedule.
    - load_state_dict takes the step count alone from the saved state and keeps this
      scheduler's base rates, which come from the recipe: LambdaLR would restore the saved
      `base_lrs`, so a resume with a new `optimizer.lr` silently kept the old one, and an
      optimizer whose rate is a tensor (torchao's 8-bit AdamW) saved it as text that then failed
      to multiply.
    - load_state_dict writes the restored step's rate into the optimizer at once. Plain
      LambdaLR only does so at the next step(), so a resume that loads the optimizer before
      building the scheduler trained one step at the warmup's first rate.
    """

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["lr_lambdas"] = [None] * len(self.lr_lambdas)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        self.last_epoch = int(state_dict["last_epoch"])
        self._step_count = int(state_dict.get("_step_count", self.last_epoch + 1))
        rates = [float(base) * shape(self.last_epoch) for base, shape in zip(self.base_lrs, self.lr_lambdas)]
        for group, rate in zip(self.optimizer.param_groups, rates):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(rate)  # a tensor rate (torchao) stays a tensor: kernels may hold it
            else:
                group["lr"] = rate
        self._last_lr = rates
