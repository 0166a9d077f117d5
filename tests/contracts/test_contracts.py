"""Contracts: the terse syntax, the chain checker (one passing and one failing chain per rule),
and the first-step check of real tensors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ditty.contracts import (
    Contract,
    ContractSyntaxError,
    Stage,
    TensorSpec,
    bind_tensors,
    check_chain,
    check_tensors,
    parse_contract,
    parse_specs,
)

# --- parsing ----------------------------------------------------------------------------------


def test_parses_the_readme_example():
    contract = parse_contract("batch:3:i64 -> batch:3:i64 | ctx.t:1:i64")
    assert contract == Contract(
        inputs=(TensorSpec("batch", 3, "i64"),),
        outputs=(TensorSpec("batch", 3, "i64"),),
        ctx_outputs=(TensorSpec("t", 1, "i64"),),
    )


def test_parses_ctx_reads_several_tensors_and_any():
    contract = parse_contract(" x:4:f32 , ctx.forward_kwargs.t:1:i64,mask:*:bool -> a, b:2, c::f16, d:*:* ")
    assert contract.inputs == (TensorSpec("x", 4, "f32"), TensorSpec("mask", None, "bool"))
    assert contract.ctx_inputs == (TensorSpec("forward_kwargs.t", 1, "i64"),)
    assert contract.outputs == (TensorSpec("a"), TensorSpec("b", 2), TensorSpec("c", None, "f16"), TensorSpec("d"))
    assert contract.ctx_outputs == ()


def test_empty_sides_are_allowed():
    assert parse_contract("-> loss:0:f32").inputs == ()
    assert parse_contract("x ->").outputs == ()
    assert parse_contract("x -> | ctx.k:0:i64").ctx_outputs == (TensorSpec("k", 0, "i64"),)


@pytest.mark.parametrize(
    "text",
    [
        "batch:3:i64 -> batch:3:i64 | ctx.t:1:i64",
        "x:4:f32, ctx.forward_kwargs.t:1:i64 -> eps:4:f32",
        "x, y:*:bf16, z:0 -> out:2:u8 | ctx.a, ctx.b.c:1:bool",
        "-> loss:0:f32",
        "ctx.target:2:f64 ->",
    ],
)
def test_round_trip(text):
    contract = parse_contract(text)
    assert parse_contract(str(contract)) == contract
    assert str(parse_contract(str(contract))) == str(contract)


def test_str_is_canonical():
    assert str(parse_contract("ctx.t:1:i64, x::f32 -> y:: ")) == "x:*:f32, ctx.t:1:i64 -> y"


# (text, column of the caret (1-based), words in the reason)
MALFORMED = [
    ("x:3:f33 -> y", 5, "unknown dtype 'f33'"),
    ("x:three -> y", 3, "expected a rank"),
    ("x:-1 -> y", 3, "expected a rank"),
    ("x y -> z", 3, "expected ',' or '->'"),
    ("x:3:f32", 8, "found the end"),
    ("x -> y | t:1", 10, "write ctx.t"),
    ("x -> ctx.t", 6, "go after '|'"),
    ("ctx -> y", 1, "'ctx' is reserved"),
    ("x, x -> y", 4, "declared twice"),
    ("x -> y | ctx.", 14, "expected a key name"),
    ("x -> y -> z", 8, "expected ',', '|' or the end"),
    ("x, -> y", 4, "expected a tensor name"),
    ("3x -> y", 1, "expected a tensor name"),
    ("x -> y |", 9, "expected a tensor name"),
]


@pytest.mark.parametrize("text,column,reason", MALFORMED)
def test_parse_error_points_at_the_character(text, column, reason):
    with pytest.raises(ContractSyntaxError) as caught:
        parse_contract(text)
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.column == column, str(error)
    assert reason in error.reason
    message_lines = str(error).splitlines()
    assert f"column {column}" in message_lines[0]
    assert message_lines[1] == f"  {text}"
    assert message_lines[2] == "  " + " " * (column - 1) + "^"


def test_parse_error_message_snapshot():
    with pytest.raises(ContractSyntaxError) as caught:
        parse_contract("batch:3:i46 -> batch:3:i64")
    assert str(caught.value) == (
        "contract syntax error at column 9: unknown dtype 'i46'; "
        "use one of f64, f32, f16, bf16, i64, i32, i16, i8, u8, bool, f (any float), i (any int), b (bool) or '*'\n"
        "  batch:3:i46 -> batch:3:i64\n"
        "          ^"
    )


def test_parse_specs_for_a_batch():
    assert parse_specs("input_ids:2:i64, labels:2:i64") == (
        TensorSpec("input_ids", 2, "i64"),
        TensorSpec("labels", 2, "i64"),
    )


def test_importing_contracts_does_not_import_torch():
    code = "import sys, ditty.contracts; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the chain checker: one valid and one failing chain per rule ------------------------------


def rules(problems, severity="error"):
    return [p.rule for p in problems if p.severity == severity]


def test_valid_diffusion_like_chain():
    stages = [
        Stage(
            "pipeline.preprocessors[0]",
            "x:4:f32 -> x_t:4:f32 | ctx.target:4:f32, ctx.forward_kwargs.t:1:i64",
            "preprocessor",
        ),
        Stage("model", "x:4:f32, ctx.forward_kwargs.t:1:i64 -> eps:4:f32", "model"),
        Stage("pipeline.loss", "pred:4:f32, ctx.target:4:f32 -> loss:0:f32", "loss", output_index=0),
    ]
    assert check_chain(stages, batch_spec="images:4:f32") == []


def test_rank_mismatch_names_the_stage():
    stages = [
        ("pre", "batch:3:i64 -> batch:3:i64 | ctx.t:1:i64"),
        Stage("model", "input_ids:2:i64 -> logits:3:f32", "model"),
    ]
    problems = check_chain(stages)
    assert rules(problems) == ["contract.mismatch"]
    assert problems[0].key == "model"
    assert "rank 2" in problems[0].message and "rank 3" in problems[0].message


def test_dtype_mismatch_against_the_batch():
    problems = check_chain([("pre", "batch:3:f32 -> batch:3:f32")], batch_spec="batch:3:i64")
    assert rules(problems) == ["contract.mismatch"]
    assert "dtype f32" in problems[0].message and "i64" in problems[0].message


def test_any_rank_and_dtype_match_everything():
    stages = [("a", "x -> y:*:*"), ("b", "y:3:f32 -> z:2"), ("c", "z:2:bf16 -> w")]
    assert check_chain(stages, batch_spec="x:5:u8") == []


def test_a_stage_may_ignore_tensors_and_match_by_name():
    assert check_chain([("a", "x -> y:2:f32, z:3:i64"), ("b", "z:3:i64 -> w")]) == []  # b takes z, ignores y
    problems = check_chain([("a", "x -> y:2:f32, z:3:i64"), ("b", "q:3:i64 -> w")])
    assert rules(problems) == ["contract.mismatch"] * 2  # no `q`: by position, y (rank and dtype differ)
    assert "`a`'s `y` (position 0) is rank 2" in problems[0].message
    assert "`a`'s `y` (position 0) is f32" in problems[1].message


def test_taking_more_tensors_than_produced():
    problems = check_chain([("a", "x -> y"), ("b", "y, z -> w")])
    assert rules(problems) == ["contract.mismatch"]
    assert "takes 2 tensor(s)" in problems[0].message and "produces 1" in problems[0].message


def test_ctx_dtype_mismatch_between_provider_and_reader():
    problems = check_chain([("a", "x -> x | ctx.t:1:i64"), ("b", "x, ctx.t:1:f32 -> x")])
    assert rules(problems) == ["contract.mismatch"]
    assert problems[0].key == "b"


def test_ctx_key_provided_before_use():
    stages = [
        ("a", "x -> x | ctx.t:1:i64"),
        ("b", "x, ctx.t:1:i64 -> x"),
        ("c", "x, ctx.batch, ctx.original_batch.labels -> x"),
    ]
    assert check_chain(stages) == []


def test_ctx_key_used_before_any_stage_provides_it():
    stages = [("a", "x, ctx.t:1:i64 -> x"), ("b", "x -> x | ctx.t:1:i64")]
    problems = check_chain(stages)
    assert rules(problems) == ["contract.ctx-missing"]
    assert problems[0].key == "a" and "ctx.t" in problems[0].message


def test_forward_kwargs_entries_must_come_from_a_stage():
    stages = [Stage("model", "x:4:f32, ctx.forward_kwargs.t:1:i64 -> eps:4:f32", "model")]
    assert rules(check_chain(stages)) == ["contract.ctx-missing"]
    provider = ("pre", "x -> x | ctx.forward_kwargs")  # a whole dict provided covers its entries
    assert check_chain([provider] + stages) == []


def test_loss_may_read_batch_columns():
    loss = Stage("pipeline.loss", "logits:3:f32, ctx.labels:2:i64 -> loss:0:f32", "loss", output_index=0)
    model = Stage("model", "input_ids:2:i64 -> logits:3:f32", "model")
    assert check_chain([model, loss], batch_spec="input_ids:2:i64, labels:2:i64") == []
    problems = check_chain([model, loss], batch_spec="input_ids:2:i64")
    assert rules(problems) == ["contract.ctx-missing"]
    # without a batch spec the column may exist: a warning, not an error
    problems = check_chain([model, loss])
    assert rules(problems) == [] and rules(problems, "warning") == ["contract.ctx-missing"]


def test_output_index_that_exists():
    stages = [
        Stage("model", "x -> logits:3:f32, aux:0:f32", "model"),
        Stage("loss", "pred:0:f32 -> loss:0:f32", "loss", output_index=1),
    ]
    assert check_chain(stages) == []
    named = [stages[0], Stage("loss", "pred:3:f32 -> loss", "loss", output_index="logits")]
    assert check_chain(named) == []


def test_output_index_that_does_not_exist():
    stages = [
        Stage("model", "x -> logits:3:f32", "model"),
        Stage("pipeline.loss", "pred:3:f32 -> loss", "loss", output_index=2),
    ]
    problems = check_chain(stages)
    assert rules(problems) == ["contract.output-index"]
    assert problems[0].key == "pipeline.loss" and "declares 1 output(s)" in problems[0].message
    named = [stages[0], Stage("loss", None, "loss", output_index="hidden")]
    assert rules(check_chain(named)) == ["contract.output-index"]


def test_composite_loss_checks_every_part_index():
    model = Stage("model", "x -> a:3:f32, b:2:i64", "model")
    assert check_chain([model, Stage("loss", None, "loss", output_index=(0, 1))]) == [
        p for p in check_chain([model, Stage("loss", None, "loss")]) if p.rule == "contract.unchecked"
    ]
    problems = check_chain([model, Stage("loss", None, "loss", output_index=(0, 3, "c"))])
    assert [p.message.split(" does")[0] for p in problems if p.severity == "error"] == [
        "output_index 3",
        "output_index 'c'",
    ]


def test_output_index_sees_postprocessed_outputs():
    stages = [
        Stage("model", "x -> a, b", "model"),
        Stage("post", "a, b -> a", "postprocessor"),
        Stage("loss", None, "loss", output_index=1),
    ]
    assert rules(check_chain(stages)) == ["contract.output-index"]


def test_loss_prediction_mismatch_uses_output_index():
    stages = [
        Stage("model", "x -> logits:3:f32, aux:0:f32", "model"),
        Stage("loss", "pred:3:f32 -> loss", "loss", output_index=1),
    ]
    problems = check_chain(stages)
    assert rules(problems) == ["contract.mismatch"] and "output 1 of `model`" in problems[0].message


def test_model_output_count_without_a_contract():
    stages = [Stage("model", None, "model"), Stage("loss", None, "loss", output_index=1)]
    assert rules(check_chain(stages, model_output_count=2)) == []
    assert rules(check_chain(stages, model_output_count=1)) == ["contract.output-index"]
    assert rules(check_chain(stages)) == []  # unknown count: nothing to say


def test_unchecked_stage_is_a_warning_and_checking_resumes():
    stages = [("a", "x:3:i64 -> x:3:i64"), ("b", None), ("c", "x:2:f32, ctx.anything -> y:2"), ("d", "y:3 -> z")]
    problems = check_chain(stages)
    assert [(p.key, p.rule, p.severity) for p in problems] == [
        ("b", "contract.unchecked", "warning"),
        ("c", "contract.ctx-missing", "warning"),  # only b, which declares nothing, may provide it
        ("d", "contract.mismatch", "error"),  # c's outputs are known again
    ]
    assert "`b`" in problems[1].message


def test_contract_that_does_not_parse_is_reported_with_the_stage():
    problems = check_chain([("pipeline.preprocessors[1]", "x:3:f33 -> x")])
    assert rules(problems) == ["contract.syntax"]
    assert problems[0].key == "pipeline.preprocessors[1]" and "^" in problems[0].message


def test_every_problem_is_reported_at_once():
    stages = [("a", "x, ctx.t -> x:3"), Stage("m", "x:2 -> y", "model"), Stage("l", None, "loss", output_index=5)]
    assert sorted(rules(check_chain(stages))) == ["contract.ctx-missing", "contract.mismatch", "contract.output-index"]


def test_unknown_role_is_a_programming_error():
    with pytest.raises(ValueError, match="role"):
        check_chain([Stage("x", None, "postprocesser")])


# --- the first-step check of real tensors -----------------------------------------------------


def test_real_tensors_that_match():
    import torch

    contract = "x:4:f32, ctx.forward_kwargs.t:1:i64 -> eps:4:f32"
    ctx = {"forward_kwargs": {"t": torch.zeros(2, dtype=torch.long)}}
    bound = bind_tensors(contract, torch.zeros(2, 1, 8, 8), ctx)
    assert set(bound) == {"x", "ctx.forward_kwargs.t"}
    assert check_tensors(contract, bound) == []
    assert (
        check_tensors(contract, bind_tensors(contract, torch.zeros(2, 1, 8, 8), side="outputs"), side="outputs") == []
    )


def test_real_tensors_that_do_not_match():
    import torch

    contract = parse_contract("input_ids:2:i64, labels:2:i64, ctx.t:1:i64 -> logits:3:f32")
    batch = {"input_ids": torch.zeros(2, 5, dtype=torch.int32), "labels": torch.zeros(2, 5, 3, dtype=torch.long)}
    ctx = {"t": 3}
    problems = check_tensors(contract, bind_tensors(contract, batch, ctx), stage="model")
    messages = [p.message for p in problems]
    assert len(problems) == 3 and all(p.key == "model" and p.rule == "contract.tensor" for p in problems)
    assert "dtype i64 declared, but the tensor is int32" in messages[0]
    assert "rank 2 declared, but the tensor has shape (2, 5, 3)" in messages[1]
    assert "`ctx.t` is a int, not a tensor" in messages[2]


def test_real_outputs_bind_by_position_and_missing_ones_are_reported():
    import torch

    contract = "x -> logits:3:f32, aux:0:f32"
    outputs = (torch.zeros(1, 2, 3), torch.zeros(2))
    problems = check_tensors(contract, bind_tensors(contract, outputs, side="outputs"), side="outputs")
    assert [p.message for p in problems] == ["output `aux`: rank 0 declared, but the tensor has shape (2,)"]
    problems = check_tensors(contract, bind_tensors(contract, outputs[:1], side="outputs"), side="outputs")
    assert [p.message for p in problems] == ["declares output `aux`, but it was not found"]


# --- the original Ditty's grammar: '|' before '->' (reads), dtype wildcards, empty contracts ----


def test_the_original_ditty_contracts_parse():
    from ditty.contracts import as_contract

    model = parse_contract("tokens:3:i64 -> logits:4:f, z0_pred:4:f, mask:3:b")
    assert model.outputs == (TensorSpec("logits", 4, "f"), TensorSpec("z0_pred", 4, "f"), TensorSpec("mask", 3, "b"))
    loss = parse_contract("logits:4:f, z0_pred:4:f | ctx.input_ids:3:i64 -> loss:0:f")
    assert loss.inputs == (TensorSpec("logits", 4, "f"), TensorSpec("z0_pred", 4, "f"))
    assert loss.ctx_inputs == loss.ctx_deps == (TensorSpec("input_ids", 3, "i64"),)
    assert loss.ctx_outputs == () and loss.outputs == (TensorSpec("loss", 0, "f"),)
    readme = parse_contract("batch:3:i64 -> batch:3:i64 | ctx.t:1:i64")  # the seed README: '|' after '->' adds
    assert readme.ctx_outputs == (TensorSpec("t", 1, "i64"),) and readme.ctx_inputs == ()
    both = parse_contract("x:3:f | ctx.target:4:f, mask:3:b -> y:4:f | ctx.out:1:i")  # bare name: a read
    assert [s.name for s in both.ctx_inputs] == ["target", "mask"] and both.ctx_outputs[0].dtype == "i"
    assert parse_contract("| ctx.hidden_states:3:f -> loss:0:f").ctx_inputs[0].is_ctx
    assert parse_contract(str(loss)) == loss and loss.raw.startswith("logits:4:f, z0_pred")
    assert as_contract("") is None and as_contract("   ") is None  # the original's "no contract"
    with pytest.raises(ContractSyntaxError):
        parse_contract("")


@pytest.mark.parametrize(
    "text,column,reason",
    [
        ("x | -> y", 5, "expected a tensor name"),
        ("x | t:1 y -> z", 9, "after the context keys read"),
        ("x | t:1 | u -> z", 9, "after the context keys read"),
        ("x:3:g -> y", 5, "unknown dtype 'g'"),
        ("x | ctx.t, t -> y", 12, "declared twice"),
    ],
)
def test_errors_in_the_original_placement_point_at_the_character(text, column, reason):
    with pytest.raises(ContractSyntaxError) as caught:
        parse_contract(text)
    assert caught.value.column == column and reason in caught.value.reason, str(caught.value)
    assert str(caught.value).splitlines()[2] == "  " + " " * (column - 1) + "^"


def test_dtype_wildcards_in_the_chain_and_on_real_tensors():
    import torch

    from ditty.contracts import ContractParseError, ContractViolation

    assert check_chain([("a", "x -> y:2:f16"), ("b", "y:2:f -> z:1:i"), ("c", "z:1:i32 -> w")]) == []
    problems = check_chain([("a", "x -> y:2:f"), ("b", "y:2:i -> z")])
    assert rules(problems) == ["contract.mismatch"] and "dtype i" in problems[0].message
    contract = parse_contract("x:2:f, m:2:b | ctx.t:1:i -> y")
    ok = {"x": torch.zeros(2, 3, dtype=torch.bfloat16), "m": torch.ones(2, 3, dtype=torch.bool)}
    contract.validate_inputs(ok, {"t": torch.zeros(2, dtype=torch.int32)})
    with pytest.raises(ContractViolation) as caught:
        contract.validate_inputs((torch.zeros(2, 3, dtype=torch.long), ok["m"]), {"t": torch.zeros(2)})
    assert [p.rule for p in caught.value.problems] == ["contract.tensor"] * 2
    assert "dtype f declared, but the tensor is int64" in str(caught.value)
    with pytest.raises(ContractViolation, match="expected 2 inputs, got 1"):
        contract.validate_inputs((ok["x"],), {})
    with pytest.raises(ContractViolation, match="rank 2"):
        TensorSpec(name="logits", rank=2, dtype="f").validate(torch.zeros(3))
    TensorSpec(name="mask", rank=1, dtype="b").validate(torch.zeros(3, dtype=torch.bool))
    assert issubclass(ContractSyntaxError, ContractParseError)


def test_validate_pipeline_chain_and_format_pipeline_contracts_the_original_way():
    from ditty.contracts import format_pipeline_contracts, validate_pipeline_chain

    pre = [parse_contract("batch:2:i64 -> batch:2:i64 | ctx.target:2:i64, ctx.mask:2:f")]
    model = parse_contract("batch:2:i64 -> logits:3:f, hidden:3:f")
    loss = parse_contract("logits:3:f | ctx.target:2:i64, ctx.mask:2:f -> loss:0:f")
    assert validate_pipeline_chain(pre, model, [], loss) == []
    errors = validate_pipeline_chain([], model, [], loss)
    assert len(errors) == 2 and errors[0].startswith("LossCalculator: reads ctx.target before any stage")
    errors = validate_pipeline_chain(pre, "batch:3:i64 -> logits:3:f", [], "logits:3:f, hidden:3:f -> loss:0:f")
    assert [e.split(":")[0] for e in errors] == ["Model", "LossCalculator"]
    text = format_pipeline_contracts([("token_masker", pre[0])], ("model", model), [], ("loss", loss))
    assert text.splitlines()[0] == "Pipeline Contracts:" and "  token_masker:" in text
    assert "Model (model):\n  batch:2:i64 -> logits:3:f, hidden:3:f" in text
