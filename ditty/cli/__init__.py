"""The `ditty` command line (the console script `ditty = ditty.cli:main`, and `python -m ditty`).

`commands` parses the arguments and runs each command; `plan` holds `ditty check --plan` and
`ditty init --method`.
"""

from ditty.cli.commands import main

__all__ = ["main"]
