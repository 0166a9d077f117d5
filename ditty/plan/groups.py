"""The optimizer's parameter groups of a recipe, from the model's tensor inventory (no weights).

`ditty check` prints them: each group's algorithm, decay and lr factor with its tensor and
parameter counts, and the tensors Muon takes, with layer indices folded ("model.layers.N.mlp.up_proj.weight").
The groups come from the rules the optimizer builder applies (ditty.optim.groups) over the tensors
the trainer will train (ditty.plan.parameters: adapters included, frozen weights left out).
"""

from __future__ import annotations

import re
from typing import Any

from ditty.config.errors import RecipeError
from ditty.optim.groups import Group, ParamInfo, group_parameters, unmatched_patterns


def planned_groups(config: Any) -> list[Group]:
    """The groups `config` builds; a RecipeError when the model's shape cannot be known offline."""
    return group_parameters(trainable_tensors(config), config.optimizer)


def trainable_tensors(config: Any) -> list[ParamInfo]:
    """The tensors the trainer of `config` will train, from the model's config (no weights)."""
    from ditty.plan.parameters import held_tensors
    from ditty.plan.settings import Settings, Target
    from ditty.plan.source import model_shape

    shape = model_shape(config)
    settings = Settings.resolve(config, shape, Target(device="cpu"))
    return [t.param_info for t in held_tensors(shape, settings) if t.trainable]


def fold_layers(names: list[str]) -> list[str]:
    """Names with every layer index replaced by N, each once, in order."""
    folded = [re.sub(r"(^|\.)\d+\.", r"\1N.", name) for name in names]
    return list(dict.fromkeys(folded))


def describe_groups(config: Any) -> str:
    """The text `ditty check` prints under "optimizer groups"."""
    if config.model.factory:  # a user's factory is not run by `ditty check` just to list its tensors
        return "optimizer groups: known once the custom model is built"
    try:
        trainable = trainable_tensors(config)
        groups = group_parameters(trainable, config.optimizer)
    except RecipeError as error:
        return f"optimizer groups: known once the model is built ({error.problems[0].message})"
    except Exception as error:  # noqa: BLE001 - an architecture the meta build cannot make: the check still passes
        return f"optimizer groups: known once the model is built ({type(error).__name__}: {error})"
    lines = ["optimizer groups:"]
    for group in groups:
        lines.append(f"  {group.describe()}")
        if group.algorithm == "muon":
            lines += [f"      {name}" for name in fold_layers(group.names)]
    if config.optimizer.kind == "muon" and not any(g.algorithm == "muon" for g in groups):
        lines.append(
            "  Muon takes no tensor: it updates the 2-D weights inside numbered blocks (model.layers.N...), "
            "and this model has none; everything trains with AdamW"
        )
    lines += [f"  warning: {warning}" for warning in unmatched_patterns(trainable, config.optimizer)]
    return "\n".join(lines)
