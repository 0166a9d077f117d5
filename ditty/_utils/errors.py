"""`RunFailure`: a run that stopped for a reason its message explains in full.

Not a user error (that is `ditty.config.errors.RecipeError`, exit code 2): the recipe was valid,
but the run could not go on (a disk filled up, the numbers diverged). The command line prints the
message without a traceback and exits with code 1; the message says what is kept on disk and how
to continue.
"""

from __future__ import annotations


class RunFailure(RuntimeError):
    """The run stopped; `str(error)` is the whole story (exit code 1, no traceback)."""
