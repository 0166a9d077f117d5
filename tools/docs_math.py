"""MkDocs hook: the pages' math as MathML, made at build time, so the site needs no script and no
network to show it (browsers draw MathML themselves).

A page writes LaTeX between `$$ ... $$` (a display) or `$...$` (inline); pymdownx.arithmatex (in
its "generic" mode) marks it as `<div class="arithmatex">\\[...\\]</div>` or
`<span class="arithmatex">\\(...\\)</span>`, and this hook replaces each with the MathML that
latex2mathml makes of it. A formula latex2mathml cannot read fails the build, naming the page.
"""

from __future__ import annotations

import html
import re

MATH = re.compile(r'<(?P<tag>div|span) class="arithmatex">\s*\\(?P<open>[\[(])(?P<tex>.*?)\\[\])]\s*</(?P=tag)>', re.S)


def to_mathml(tex: str, display: bool) -> str:
    from latex2mathml.converter import convert

    return convert(tex, display="block" if display else "inline")


def on_page_content(content: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        tex = html.unescape(match.group("tex")).strip()
        display = match.group("open") == "["
        try:
            mathml = to_mathml(tex, display)
        except Exception as error:  # latex2mathml raises its own errors for LaTeX it does not know
            raise ValueError(f"{page.file.src_path}: cannot render the formula {tex!r}: {error}") from error
        return f'<div class="math">{mathml}</div>' if display else mathml

    return MATH.sub(replace, content)
