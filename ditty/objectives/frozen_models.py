"""What a model given by path must be before it serves as a frozen reference or teacher
(`preference.reference`, `distill.teacher`), beyond what `ditty check` reads from its config.json:
intact files (a run's final/ carries a manifest), and an output head that came from its checkpoint."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from ditty._utils.modules import unwrap


def refuse_damaged(path: str, key: str) -> None:
    """A RecipeError naming `key` when `path` is a saved model directory with a manifest (a run's
    final/) whose files do not match it: damaged weights would score every token as NaN or noise."""
    from ditty.checkpoint.integrity import check_model_dir
    from ditty.config.errors import RecipeError

    local = os.path.expanduser(path)
    if not os.path.isdir(local):
        return
    try:
        check_model_dir(local)
    except RecipeError as damaged:
        raise RecipeError([replace(p, key=key) for p in damaged.problems], source=damaged.source) from None


def refuse_new_head(model: Any, path: str, key: str) -> None:
    """A frozen model whose output head did not come from its checkpoint (a classifier's or reward
    model's weights loaded as a causal LM): its head would be random, a teacher of noise."""
    head = tuple(getattr(unwrap(model), "ditty_new_head", ()) or ())
    if head:
        from ditty.config.errors import RecipeError

        raise RecipeError.single(
            f"{path!r} has no weights for the causal LM's output head ({', '.join(head[:4])}): it is not a causal LM "
            "(a classifier's or a reward model's weights), and that head would be random",
            key=key,
            fix="name a causal LM trained with the same tokenizer",
        )
