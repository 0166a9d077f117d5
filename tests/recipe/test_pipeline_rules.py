"""The pipeline rules of the compiler: named components are checked before anything is called, then
their contracts must chain. One valid and one failing recipe per rule; bad input exits 2 at `ditty check`."""

from __future__ import annotations

import pytest

from ditty.cli import main
from ditty.config.loader import parse_recipe
from ditty.recipe import compile_recipe
from tests.recipe import stages

HEAD = """
[run]
output_dir = "{out}"
[model]
factory = "{factory}"
[data]
source = "builtin"
name = "digits"
[train]
steps = 10
global_batch_size = 8
micro_batch_size = 8
"""
NOISE = """
[[pipeline.preprocessors]]
use = "ditty.diffusion:NoisePreProcessor"
kwargs = { max_timesteps = 50 }
"""
LOSS = """
[[pipeline.loss]]
use = "tests.recipe.stages:ContractLoss"
"""
DENOISER = "ditty.models.denoiser:digits_denoiser"


def recipe(tmp_path, body: str = NOISE + LOSS, factory: str = DENOISER) -> str:
    return HEAD.format(out=tmp_path / "run", factory=factory) + body


def problems(tmp_path, body: str = NOISE + LOSS, factory: str = DENOISER, severity: str = "error"):
    plan = compile_recipe(parse_recipe(recipe(tmp_path, body, factory), source="r.toml"))
    return [p for p in plan.problems if p.severity == severity and p.rule.startswith(("pipeline", "contract"))]


def one(found, rule: str):
    assert [p.rule for p in found] == [rule], [p.format() for p in found]
    return found[0]


@pytest.fixture(autouse=True)
def no_calls():
    stages.CALLS.clear()
    yield


# --- pipeline.components -------------------------------------------------------------------------


def test_the_diffusion_pipeline_is_valid(tmp_path):
    assert problems(tmp_path) == []
    assert problems(tmp_path, severity="warning") == []  # every stage declares a contract


def test_missing_module_is_a_recipe_error(tmp_path):
    found = one(
        problems(tmp_path, NOISE.replace("ditty.diffusion", "tests.recipe.no_such_module") + LOSS),
        "pipeline.components",
    )
    assert found.key == "pipeline.preprocessors[0].use" and "cannot import module" in found.message


def test_missing_attribute_is_a_recipe_error(tmp_path):
    found = one(problems(tmp_path, NOISE + LOSS.replace("ContractLoss", "NoSuchLoss")), "pipeline.components")
    assert found.key == "pipeline.loss[0].use" and "no attribute 'NoSuchLoss'" in found.message


def test_os_system_is_refused_never_run(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("os.system", lambda *a, **k: calls.append(a))
    body = '[[pipeline.preprocessors]]\nuse = "os:system"\nkwargs = { command = "touch pwned" }\n' + LOSS
    found = one(problems(tmp_path, body), "pipeline.components")
    assert "not a subclass of ditty.PreProcessor" in found.message and "never called" in found.message
    found = one(problems(tmp_path, NOISE + LOSS, factory="os:system"), "pipeline.components")
    assert found.key == "model.factory"
    assert calls == []


def test_a_class_of_the_wrong_slot_is_refused_and_not_constructed(tmp_path):
    body = NOISE + '[[pipeline.postprocessors]]\nuse = "tests.recipe.stages:NotAStage"\n' + LOSS
    found = one(problems(tmp_path, body), "pipeline.components")
    assert found.key == "pipeline.postprocessors[0].use" and "PostProcessor" in found.message
    assert stages.CALLS == []  # and, as something failed, no other stage was constructed either


def test_arguments_are_bound_not_called(tmp_path):
    body = NOISE + LOSS + "kwargs = { wrong = 1 }\n"
    found = one(problems(tmp_path, body), "pipeline.components")
    assert found.key == "pipeline.loss[0].use.kwargs" and "wrong" in found.message
    assert stages.CALLS == []


def test_abstract_loss_is_refused(tmp_path):
    found = one(problems(tmp_path, NOISE + LOSS.replace("ContractLoss", "Abstract")), "pipeline.components")
    assert "abstract" in found.message


@pytest.mark.parametrize(
    ("factory", "text"),
    [
        ("tests.recipe.stages:unannotated_factory", "no return annotation"),
        ("tests.recipe.stages:dict_factory", "not a torch.nn.Module"),
        ("tests.recipe.stages:Stage", "not a torch.nn.Module"),
    ],
)
def test_a_factory_must_be_known_to_return_a_module(tmp_path, factory, text):
    found = one(problems(tmp_path, factory=factory), "pipeline.components")
    assert found.key == "model.factory" and text in found.message
    assert stages.CALLS == []


def test_factory_kwargs_bind(tmp_path):
    text = recipe(tmp_path).replace(
        f'factory = "{DENOISER}"', f'factory = "{DENOISER}"\nfactory_kwargs = {{ widht = 3 }}'
    )
    plan = compile_recipe(parse_recipe(text, source="r.toml"))
    found = [p for p in plan.errors if p.rule == "pipeline.components"]
    assert [p.key for p in found] == ["model.factory_kwargs"] and "widht" in found[0].message


def test_a_model_spec_is_a_factory(tmp_path):
    assert problems(tmp_path, factory="ditty.models.registry:DIGITS_DENOISER") == []


# --- pipeline.contracts: one valid and one failing chain per contract rule -------------------------


def stage(contract: str, slot: str = "preprocessors", cls: str = "Stage") -> str:
    return f'[[pipeline.{slot}]]\nuse = "tests.recipe.stages:{cls}"\nkwargs = {{ contract = "{contract}" }}\n'


def test_contract_syntax(tmp_path):
    assert problems(tmp_path, NOISE + stage("x_t:4:f32 -> x_t:4:f32") + LOSS) == []
    found = one(problems(tmp_path, NOISE + stage("x_t:4:q32 -> x_t:4:f32") + LOSS), "contract.syntax")
    assert found.key == "pipeline.preprocessors[1] (Stage)" and "column 7" in found.message and "^" in found.message


def test_rank_mismatch(tmp_path):
    assert problems(tmp_path, NOISE + stage("x_t:4:f32 -> x_t:4:f32") + LOSS) == []
    found = one(problems(tmp_path, NOISE + stage("x_t:4:f32 -> x_t:3:f32") + LOSS), "contract.mismatch")
    assert found.key == f"model.factory ({DENOISER})" and "rank 4" in found.message and "rank 3" in found.message


def test_dtype_mismatch(tmp_path):
    found = one(problems(tmp_path, NOISE + stage("x_t:4:f32 -> x_t:4:f16") + LOSS), "contract.mismatch")
    assert found.key == f"model.factory ({DENOISER})" and "dtype f32" in found.message and "f16" in found.message


def test_stages_that_take_more_than_is_given(tmp_path):
    found = one(problems(tmp_path, NOISE + stage("a:4:f32, b:4:f32 -> a:4:f32") + LOSS), "contract.mismatch")
    assert found.key == "pipeline.preprocessors[1] (Stage)" and "takes 2 tensor(s)" in found.message


def test_context_key_used_before_it_is_provided(tmp_path):
    # The denoiser reads ctx.forward_kwargs.t, which only the noising stage provides.
    assert problems(tmp_path, NOISE + LOSS) == []
    found = problems(tmp_path, stage("x:4:f32 -> x:4:f32") + LOSS)
    assert [p.rule for p in found] == ["contract.ctx-missing"] * 2
    assert found[0].key == f"model.factory ({DENOISER})" and "ctx.forward_kwargs.t" in found[0].message
    # The digits batch is a tensor of images, so the loss cannot find ctx.target among its columns either.
    assert found[1].key == "pipeline.loss[0] (ContractLoss)" and "ctx.target" in found[1].message


def test_loss_output_index(tmp_path):
    two_heads = "tests.recipe.stages:TwoHeads"
    index_one = LOSS + 'kwargs = { output_index = 1, contract = "logits:2:f32 -> loss:0:f32" }\n'
    assert problems(tmp_path, NOISE + index_one, factory=two_heads) == []
    found = one(problems(tmp_path, NOISE + LOSS + "kwargs = { output_index = 1 }\n"), "contract.output-index")
    assert found.key == "pipeline.loss[0] (ContractLoss)" and "output_index 1 does not exist" in found.message


def test_composite_loss_checks_each_part_index(tmp_path):
    second = 'weight = 0.1\nkwargs = { output_index = 1, contract = "logits:2:f32 -> loss:0:f32" }\n'
    composite = LOSS + "weight = 1.0\n" + LOSS + second
    assert problems(tmp_path, NOISE + composite, factory="tests.recipe.stages:TwoHeads") == []
    found = one(problems(tmp_path, NOISE + composite), "contract.output-index")
    assert found.key == "pipeline.loss (composite) part 1 (ContractLoss)"


def test_composite_loss_checks_each_part_contract(tmp_path):
    # The second part reads output 1 (logits, rank 2) but declares a rank-4 prediction: refused, part named.
    wrong = LOSS + "weight = 1.0\n" + LOSS + "weight = 0.1\nkwargs = { output_index = 1 }\n"
    found = one(problems(tmp_path, NOISE + wrong, factory="tests.recipe.stages:TwoHeads"), "contract.mismatch")
    assert found.key == "pipeline.loss (composite) part 1 (ContractLoss)" and "rank 4" in found.message
    reads = LOSS + 'kwargs = { contract = "eps:4:f32, ctx.nowhere:4:f32 -> loss:0:f32" }\n'
    found = one(problems(tmp_path, NOISE + LOSS + reads), "contract.ctx-missing")
    assert found.key == "pipeline.loss (composite) part 1 (ContractLoss)"


def test_postprocessor_output_feeds_the_loss(tmp_path):
    assert problems(tmp_path, NOISE + stage("eps:4:f32 -> eps:4:f32", "postprocessors", "Post") + LOSS) == []
    found = one(
        problems(tmp_path, NOISE + stage("eps:4:f32 -> eps:2:f32", "postprocessors", "Post") + LOSS),
        "contract.mismatch",
    )
    assert found.key == "pipeline.loss[0] (ContractLoss)"


def test_non_text_data_needs_a_loss(tmp_path):
    found = one(problems(tmp_path, ""), "pipeline.contracts")
    assert found.key == "pipeline.loss"


# --- exit code 2 at `ditty check`, stage named -----------------------------------------------------


@pytest.mark.parametrize(
    ("body", "factory", "named"),
    [
        (NOISE + stage("x_t:4:q32 -> x_t") + LOSS, DENOISER, "pipeline.preprocessors[1] (Stage)"),
        (NOISE + stage("x_t:4:f32 -> x_t:2:f32") + LOSS, DENOISER, f"model.factory ({DENOISER})"),
        (NOISE + LOSS + "kwargs = { output_index = 3 }\n", DENOISER, "pipeline.loss[0] (ContractLoss)"),
        (NOISE + LOSS, "tests.recipe.nowhere:build", "model.factory"),
    ],
)
def test_bad_pipelines_stop_at_check_with_exit_2(tmp_path, capsys, body, factory, named):
    path = tmp_path / "bad.toml"
    path.write_text(recipe(tmp_path, body, factory))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"`{named}`" in err and "Traceback" not in err
