"""The original Ditty's chain functions, over ditty's checker.

`validate_pipeline_chain(pre, model, post, loss)` takes the contracts of each slot (Contract objects,
strings, or None for a stage without one) and returns the errors as strings, as the original did;
`format_pipeline_contracts` lays the named contracts out for reading. Both name stages as the
original did ("Preprocessor 0", "Model", "LossCalculator").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

from ditty.contracts.chain import Stage, check_chain
from ditty.contracts.spec import Contract, as_contract

ContractLike = Union[Contract, str, None]
RULE = "=" * 60


def validate_pipeline_chain(
    preprocessor_contracts: Sequence[ContractLike],
    model_contract: ContractLike,
    postprocessor_contracts: Sequence[ContractLike],
    loss_contract: ContractLike,
) -> list[str]:
    """Check that the contracts chain; return one line per error (empty when they fit).

    The loss takes its prediction from output 0 of the last producer (LossCalculator's default
    `output_index`); its other tensors are matched by name. Warnings (stages without a contract,
    context keys an undeclared stage may provide) are not errors and are not returned.
    """
    stages = [Stage(f"Preprocessor {i}", c, "preprocessor") for i, c in enumerate(preprocessor_contracts)]
    stages.append(Stage("Model", model_contract, "model"))
    stages += [Stage(f"Postprocessor {i}", c, "postprocessor") for i, c in enumerate(postprocessor_contracts)]
    stages.append(Stage("LossCalculator", loss_contract, "loss", 0))
    # The original's context held no batch columns: a key nothing provides is an error.
    return [f"{p.key}: {p.message}" for p in check_chain(stages, batch_columns=()) if p.severity == "error"]


def format_pipeline_contracts(
    preprocessor_contracts: Sequence[tuple[str, ContractLike]],
    model_contract: tuple[str, ContractLike],
    postprocessor_contracts: Sequence[tuple[str, ContractLike]],
    loss_contract: tuple[str, ContractLike],
) -> str:
    """The named contracts of a pipeline, one stage after the other, as readable text."""
    lines = ["Pipeline Contracts:", RULE]
    if preprocessor_contracts:
        lines.append("\nPreprocessors:")
        lines += [line for name, c in preprocessor_contracts for line in (f"  {name}:", f"    {_show(c)}")]
    lines += [f"\nModel ({model_contract[0]}):", f"  {_show(model_contract[1])}"]
    if postprocessor_contracts:
        lines.append("\nPostprocessors:")
        lines += [line for name, c in postprocessor_contracts for line in (f"  {name}:", f"    {_show(c)}")]
    lines += [f"\nLossCalculator ({loss_contract[0]}):", f"  {_show(loss_contract[1])}", RULE]
    return "\n".join(lines)


def _show(contract: ContractLike) -> str:
    parsed: Optional[Contract] = as_contract(contract)
    return str(parsed) if parsed is not None else "(no contract)"
