"""A pipeline's stages as text: each stage's name and contract, and what the chain check found.

`describe_chain` serves `print(pipeline)` / `Pipeline.describe()` and `ditty.print_pipeline`:

    pipeline: batch -> preprocessors -> model -> postprocessors -> loss
      preprocessors[0] (SplitTarget)   rows:2:f32 -> x:2:f32 | ctx.target:2:f32   checked
      model (Regressor)                x:2:f32 -> y:2:f32                          checked
      loss (MSELoss)                   y:2:f32, ctx.target:2:f32 -> loss:0:f32     checked
    contracts: 3 of 3 stages checked; the chain fits

A stage is "checked" when it declares a contract that parses (its neighbours are then compared
with it); "unchecked" when it declares none; a problem the chain check found is listed under its
stage. A CompositeLoss shows each part (with its weight) as a stage of its own.
"""

from __future__ import annotations

from typing import Any, Optional

from ditty.config.errors import Problem
from ditty.contracts import ContractSyntaxError, Stage, as_contract, check_chain
from ditty.recipe.pipeline_rules import chain_stages, instance_names


def describe_chain(
    pre: list,
    model: Any,
    post: list,
    loss: Any,
    *,
    model_name: Optional[str] = None,
    batch_spec: Any = None,
    title: str = "pipeline",
    default_loss: str = "the default CausalLMLoss",
) -> str:
    """The chain preprocessors -> model -> postprocessors -> loss with each stage's contract and status;
    `default_loss` names the loss that runs when none is given (an objective's own, say)."""
    names = instance_names(pre, model, post, loss, model_name=model_name)
    stages = chain_stages(**names)
    problems = check_chain(stages, batch_spec=batch_spec)
    weights = _part_weights(loss, names["loss_name"])
    rows = [(_label(s, weights), _contract_text(s), _status(s)) for s in stages]
    if loss is None:
        rows.append((f"loss ({default_loss})", "", "unchecked"))
    width = max(len(r[0]) for r in rows)
    contract_width = min(max(len(r[1]) for r in rows), 60)
    lines = [f"{title}: batch -> preprocessors -> model -> postprocessors -> loss"]
    for (label, contract, status), stage in zip(rows, stages + [None] * (len(rows) - len(stages))):
        lines.append(f"  {label:<{width}}  {contract or '(no contract)':<{contract_width}}  {status}")
        for problem in problems:
            if stage is not None and problem.key == stage.name and problem.rule != "contract.unchecked":
                lines.append(f"      {problem.severity}: {_first_line(problem)}")
    checked = sum(1 for _, _, status in rows if status == "checked")
    errors = [p for p in problems if p.severity == "error"]
    verdict = f"{len(errors)} problem(s) in the chain" if errors else "the chain fits"
    lines.append(f"contracts: {checked} of {len(rows)} stages checked; {verdict}")
    return "\n".join(lines)


def _part_weights(loss: Any, loss_name: str) -> dict[str, str]:
    """Stage name of each CompositeLoss part -> its weight as shown (nested composites included);
    an UncertaintyWeightedLoss learns its weights."""
    out: dict[str, str] = {}
    learned = hasattr(loss, "log_vars")
    for index, (part, weight) in enumerate(getattr(loss, "parts", None) or ()):
        name = f"{loss_name} part {index} ({type(part).__name__})"
        out[name] = "(learned weight)" if learned else f"x {weight:g}"
        out.update(_part_weights(part, name))
    return out


def _label(stage: Stage, weights: dict[str, str]) -> str:
    return f"{stage.name} {weights[stage.name]}" if stage.name in weights else stage.name


def _contract_text(stage: Stage) -> str:
    try:
        contract = as_contract(stage.contract)
    except ContractSyntaxError:
        return str(stage.contract)
    return str(contract) if contract is not None else ""


def _status(stage: Stage) -> str:
    try:
        return "checked" if as_contract(stage.contract) is not None else "unchecked"
    except ContractSyntaxError:
        return "does not parse"


def _first_line(problem: Problem) -> str:
    return problem.message.splitlines()[0]
