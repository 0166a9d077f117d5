"""MkDocs hook: the command-line pages show what `ditty COMMAND --help` prints, made at build time.

A page asks for a command's help with a marker line, `<!-- ditty-help: run -->` (`<!-- ditty-help: -->`
for `ditty --help`); the hook replaces it with the text in a code block. The texts come from one
child process that calls `ditty.cli.main([COMMAND, "--help"])` for every command, so the page shows
exactly what a user's terminal does (at 80 columns), and the build's own logging is untouched by
the command line's set-up (which quiets some libraries' loggers).

`python tools/docs_cli_help.py` prints the texts, for a look without building the site.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!--\s*ditty-help:\s*([\w-]*)\s*-->\s*$", re.M)
COLUMNS = "80"

# Runs in the child: the commands come from the CLI's own table, so a new command gets a page check.
_CHILD = """
import contextlib, io, json
from ditty.cli.commands import COMMANDS, main
texts = {}
for command in ["", *COMMANDS]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([command, "--help"] if command else ["--help"])
    assert code == 0, (command, code)
    texts[command] = out.getvalue()
print(json.dumps(texts))
"""


def help_texts() -> dict[str, str]:
    """`ditty --help` (key "") and `ditty COMMAND --help` for every command, as printed."""
    env = {"COLUMNS": COLUMNS, "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TERM": "dumb", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"ditty --help failed while building the docs:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


_TEXTS: dict[str, str] | None = None


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace each `<!-- ditty-help: COMMAND -->` line with that command's help in a text block."""
    global _TEXTS
    if not MARKER.search(markdown):
        return markdown
    if _TEXTS is None:  # once per build, and only when a page asks
        _TEXTS = help_texts()

    def block(match: re.Match) -> str:
        command = match.group(1)
        if command not in _TEXTS:
            raise ValueError(f"{page.file.src_path}: no command {command!r}; ditty has {sorted(_TEXTS)}")
        shown = f"ditty {command} --help" if command else "ditty --help"
        return f"```text\n$ {shown}\n{_TEXTS[command].rstrip()}\n```"

    return MARKER.sub(block, markdown)


def on_startup(command, dirty) -> None:
    global _TEXTS
    _TEXTS = None  # `mkdocs serve` rebuilds: read the help again


if __name__ == "__main__":
    for name, text in help_texts().items():
        print(f"==== ditty {name} --help\n{text}")
