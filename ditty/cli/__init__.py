"""The `ditty` command line (the console script `ditty = ditty.cli:main`, and `python -m ditty`).

`commands` parses the arguments and runs run, check, init, ls and plot; `readers` runs the commands
that read a finished run (generate, export, push, eval); `trust` decides which code a command may
import; `usage` prints the help; `options` takes a command's own options out of its arguments;
`plan` holds `ditty check --plan` and `ditty init --method`.
"""

from ditty.cli.commands import main

__all__ = ["main"]
