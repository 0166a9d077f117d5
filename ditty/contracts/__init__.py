"""Stage contracts: what each pipeline stage takes and gives, checked before anything runs.

A stage (preprocessor, model, postprocessor, loss) may declare a terse contract string:

    "x:4:f32, ctx.t:1:i64 -> eps:4:f32 | ctx.target:4:f32"

Grammar (spaces are allowed around every token):

    contract  := tensors [ "|" reads ] "->" tensors [ "|" adds ]
    tensors   := [ item ("," item)* ]              an empty side is allowed ("-> loss:0:f32")
    item      := NAME spec                          a tensor passed along the pipeline
               | "ctx." KEY spec                    (input side only) a context entry the stage reads
    reads     := ["ctx."] KEY spec ("," ["ctx."] KEY spec)*   context entries the stage reads
    adds      := "ctx." KEY spec ("," "ctx." KEY spec)*   context entries the stage adds
    spec      := [ ":" [RANK] [ ":" DTYPE ] ]
    NAME      := [A-Za-z_][A-Za-z0-9_]*             ("ctx" is reserved)
    KEY       := NAME ("." NAME)*                    a dotted path: ctx.forward_kwargs.t is ctx["forward_kwargs"]["t"]
    RANK      := a non-negative integer (number of dimensions, batch dimension included) | "*"
    DTYPE     := f64 f32 f16 bf16 i64 i32 i16 i8 u8 bool | f (any float) | i (any int) | b (bool) | "*"

So a `|` before `->` lists what the stage reads from the context (the original Ditty's syntax,
"logits:4:f | ctx.input_ids:3:i64 -> loss:0:f"), and a `|` after `->` what it adds
("batch:3:i64 -> batch:3:i64 | ctx.t:1:i64"); reads may also stand among the inputs as `ctx.KEY`.
An omitted rank or dtype means "any", the same as "*": `x`, `x:*:*` and `x::` are one spec.
An empty contract string ("") means the stage has no contract (`as_contract` returns None).
`str(contract)` writes the canonical form (tensors first, then ctx reads; "*" for any), which
parses back to an equal Contract.

How stages chain (`check_chain`): each tensor a stage takes is matched with the tensor of the same
name that the previous stage (or the batch) produces, else with the one at the same position. A
stage may ignore some of what it is given (a model ignores a batch's labels) but cannot take more
tensors than there are. Real values bind the same way (`bind_tensors`): a dict by key, a tuple by
position. The context is a dict that travels alongside: a stage may read only keys that the
trainer or an earlier stage provides. The loss sees the model's (post-processed) output through its
`output_index`, so its first tensor input is compared with that one output only. A stage without a contract is allowed;
it is reported as unchecked, and what comes after it is checked against unknown shapes.

One job per module: `spec` (the types and the parser), `chain` (`check_chain`), `tensors` (the
first-step check on real values), `errors` (the exceptions), `legacy` (the original Ditty's
`validate_pipeline_chain` and `format_pipeline_contracts`). Layer 1: stdlib only at import time;
torch is imported inside `check_tensors`' helpers.
"""

from ditty.contracts.chain import ROLES, OutputIndex, Stage, check_chain
from ditty.contracts.errors import ContractChainError, ContractParseError, ContractSyntaxError, ContractViolation
from ditty.contracts.legacy import format_pipeline_contracts, validate_pipeline_chain
from ditty.contracts.spec import (
    ANY,
    CTX,
    DTYPE_WILDCARDS,
    DTYPES,
    TRAINER_CTX_KEYS,
    Contract,
    TensorSpec,
    as_contract,
    dtype_names,
    dtypes_overlap,
    parse_contract,
    parse_specs,
)
from ditty.contracts.tensors import bind_tensors, check_tensors

__all__ = [
    "ANY",
    "CTX",
    "DTYPES",
    "DTYPE_WILDCARDS",
    "ROLES",
    "TRAINER_CTX_KEYS",
    "Contract",
    "ContractChainError",
    "ContractParseError",
    "ContractSyntaxError",
    "ContractViolation",
    "OutputIndex",
    "Stage",
    "TensorSpec",
    "as_contract",
    "bind_tensors",
    "check_chain",
    "check_tensors",
    "dtype_names",
    "dtypes_overlap",
    "format_pipeline_contracts",
    "parse_contract",
    "parse_specs",
    "validate_pipeline_chain",
]
