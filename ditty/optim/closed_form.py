"""The LambdaLR subclass ditty's schedules run on (imports torch: load it only to build one)."""

from __future__ import annotations

from torch.optim.lr_scheduler import LambdaLR


class ClosedFormLR(LambdaLR):
    """LambdaLR whose state is the step count alone, and which applies it when loaded.

    - state_dict leaves the shape out (LambdaLR would save LRShape's fields and let them
      override the recipe on resume): the recipe defines the shape, so a resumed run with more
      steps follows its new schedule.
    - load_state_dict writes the restored step's rate into the optimizer at once. Plain
      LambdaLR only does so at the next step(), so a resume that loads the optimizer before
      building the scheduler trained one step at the warmup's first rate.
    """

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["lr_lambdas"] = [None] * len(self.lr_lambdas)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        rates = [base * shape(self.last_epoch) for base, shape in zip(self.base_lrs, self.lr_lambdas)]
        for group, rate in zip(self.optimizer.param_groups, rates):
            group["lr"] = rate
        self._last_lr = rates
