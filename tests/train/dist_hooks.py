"""Test-only pipeline stage that fails on one rank: DITTY_TEST_FAIL_AT = "RANK:STEP[:user]".

Named in a recipe as `tests.train.dist_hooks:FailAt`. Raises a RuntimeError (a crash), or with
":user" a RecipeError (a user error, exit code 2), on that rank at that 0-based optimizer step.
"""

from __future__ import annotations

import os

from ditty.processors import PreProcessor

ENV = "DITTY_TEST_FAIL_AT"


class FailAt(PreProcessor):
    def __init__(self) -> None:
        super().__init__()
        spec = os.environ.get(ENV, "")
        parts = spec.split(":") if spec else []
        self.rank, self.step = (int(parts[0]), int(parts[1])) if parts else (None, None)
        self.user = len(parts) > 2 and parts[2] == "user"

    def process(self, batch, ctx):
        from ditty._utils.dist import rank

        if self.rank == rank() and ctx.get("training") and ctx["step"] == self.step:
            if self.user:
                from ditty.config.errors import RecipeError

                raise RecipeError.single(
                    f"injected user error on rank {self.rank}", key="data.path", fix="nothing to fix: a test"
                )
            raise RuntimeError(f"injected failure on rank {self.rank} at step {self.step}")
        return batch, ctx
