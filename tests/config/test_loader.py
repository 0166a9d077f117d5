"""The strict TOML loader: unknown keys, wrong types and bad files are RecipeErrors with lines."""

from __future__ import annotations

import pytest

from ditty.config import RecipeError, TrainerConfig
from ditty.config.loader import load_recipe, parse_recipe


def errors_of(text: str) -> list:
    with pytest.raises(RecipeError) as caught:
        parse_recipe(text, source="r.toml")
    return caught.value.problems


def test_empty_recipe_sections_take_defaults():
    loaded = parse_recipe("[train]\nsteps = 5\n")
    assert loaded.config == TrainerConfig(train=TrainerConfig().train.__class__(steps=5))
    assert loaded.provenance["train.steps"] == "toml"
    assert loaded.provenance["train.micro_batch_size"] == "default"


def test_unknown_key_names_line_and_closest_key():
    (problem,) = errors_of("[run]\nseed = 1\n\n[optimizer]\nlrr = 1e-4\n")
    assert problem.key == "optimizer.lrr"
    assert problem.line == 5
    assert "did you mean `lr`?" in problem.fix
    assert "r.toml:5:" in problem.format("r.toml")


def test_key_in_the_wrong_section_says_where_it_belongs():
    (problem,) = errors_of("[data]\nwarmup_steps = 3\n")
    assert "scheduler.warmup_steps" in problem.fix


def test_wrong_type_names_expected_and_received():
    (problem,) = errors_of('[train]\nmicro_batch_size = "8"\n')
    assert problem.key == "train.micro_batch_size" and problem.line == 2
    assert "expected an integer" in problem.message and 'string "8"' in problem.message
    assert "remove the quotes" in problem.fix


def test_int_to_float_is_the_only_coercion():
    assert parse_recipe("[optimizer]\nlr = 1\n").config.optimizer.lr == 1.0
    assert errors_of("[train]\nsteps = 1.5\n")[0].key == "train.steps"
    assert errors_of("[train]\ncompile = 1\n")[0].key == "train.compile"
    assert errors_of("[optimizer]\nlr = true\n")[0].key == "optimizer.lr"


def test_unknown_kind_suggests_the_closest_choice():
    (problem,) = errors_of('[parallel]\nkind = "fsdp2"\n')
    assert "fsdp" in problem.fix and "not a valid choice" in problem.message


def test_ten_mistakes_are_all_listed():
    text = """
[run]
sed = 1
device = "gpu"
[model]
dtype = "fp32"
trust_remote_code = "yes"
[train]
steps = "100"
compile = "false"
micro_batch_size = 2.5
[optimizer]
lrr = 1e-4
betas = [0.9]
[peft]
kind = "qlora"
"""
    problems = errors_of(text)
    assert len(problems) == 10
    assert sorted(p.line for p in problems) == [3, 4, 6, 7, 9, 10, 11, 13, 14, 16]


def test_arrays_of_tables_and_inline_tables_are_checked():
    loaded = parse_recipe('[[pipeline.loss]]\nuse = "a:b"\nkwargs = { x = 1 }\nweight = 2\n')
    assert loaded.config.pipeline.loss[0].weight == 2.0
    typo, missing = errors_of('[[pipeline.loss]]\nuse = "a:b"\n\n[[pipeline.loss]]\nuze = "a:c"\n')
    assert typo.key == "pipeline.loss.1.uze" and typo.line == 5 and "`use`" in typo.fix
    assert missing.key == "pipeline.loss.1.use" and "required" in missing.message and missing.line == 4


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "empty"),
        (b"# only a comment\n", "empty"),
        (b"\x00\x01\x02binary", "binary"),
        (b"\xff\xfe[run]", "UTF-8"),
        (b"[run\nname = 1", "not valid TOML"),
        (b"[run]\nname = ", "not valid TOML"),
    ],
)
def test_bad_files(tmp_path, content, expected):
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    with pytest.raises(RecipeError) as caught:
        load_recipe(str(path))
    assert expected in str(caught.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(RecipeError, match="no recipe file or bundled recipe"):
        load_recipe(str(tmp_path / "nope.toml"))
    with pytest.raises(RecipeError, match="is a directory"):
        load_recipe(str(tmp_path))


def test_invalid_toml_reports_its_line():
    (problem,) = errors_of("[run]\nname = 'x'\nseed = = 3\n")
    assert problem.line == 3


def test_trainer_reference_selects_the_subclass_schema():
    text = 'trainer = "examples.custom_section.trainer:MyTrainer"\n[greeting]\ntext = "hi"\n[train]\nsteps = 3\n'
    loaded = parse_recipe(text)
    assert type(loaded.config).__qualname__ == "MyTrainer.Config"
    assert loaded.config.greeting.text == "hi"
    assert loaded.trainer == "examples.custom_section.trainer:MyTrainer"


def test_trainer_reference_errors():
    (problem,) = errors_of('trainer = "no_such_module_xyz:T"\n')
    assert problem.key == "trainer" and "cannot import" in problem.message
    (problem,) = errors_of('trainer = "os:path"\n')
    assert "Config" in problem.message
    (problem,) = errors_of("trainer = 3\n")
    assert problem.key == "trainer"
