"""MkDocs hook: the pages generated from the code's registries, made at build time.

- `<!-- ditty-metrics -->`: every metrics.jsonl key, one table per group (ditty.metrics.glossary).
- `<!-- ditty-recipe-reference -->`: one table per recipe section, a row per key with its type,
  default, meaning and what it needs of other keys (ditty.recipe.reference_tables).

Both read plain data and the config dataclasses, in the build's own process (nothing of torch loads).
`python tools/docs_tables.py` prints the two, for a look without building the site.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the build may run from a checkout that is not installed
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!--\s*ditty-(metrics|recipe-reference)\s*-->\s*$", re.M)


def generated(what: str) -> str:
    if what == "metrics":
        from ditty.metrics.glossary import markdown

        return markdown()
    from ditty.recipe.reference_tables import reference_markdown

    return reference_markdown()


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda match: generated(match.group(1)), markdown)


if __name__ == "__main__":
    print(generated("metrics"))
    print(generated("recipe-reference"))
