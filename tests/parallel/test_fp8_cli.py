"""`ditty check` on FP8 recipes: Transformer Engine missing is a user error naming the package;
emulated torchao FP8 on the CPU checks clean. The Python API's accelerate-style kwargs map to [fp8]."""

from __future__ import annotations

import importlib.util

import pytest

from ditty.cli import main
from ditty.config.errors import RecipeError
from ditty.config.sections import Fp8Config
from ditty.models.float8 import Float8Converter, fp8_config_from_accelerator_kwargs


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is not None, reason="Transformer Engine is installed"
)
def test_check_te_backend_exits_2_naming_transformer_engine(capsys):
    code, out, err = run_cli(capsys, "check", "tiny_sft", "--fp8.enabled", "true", "--fp8.backend", "te")
    assert code == 2, out + err
    assert "transformer_engine" in err and "fp8.backend" in err and "Traceback" not in err


def test_check_emulated_torchao_fp8_is_valid(capsys):
    code, out, err = run_cli(capsys, "check", "tiny_sft", "--fp8.enabled", "true", "--fp8.emulate", "true")
    assert code == 0, out + err


def test_check_unemulated_fp8_on_cpu_exits_2(capsys):
    code, _, err = run_cli(capsys, "check", "tiny_sft", "--run.device", "cpu", "--fp8.enabled", "true")
    assert code == 2 and "fp8.emulate" in err


@pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is not None, reason="Transformer Engine is installed"
)
def test_te_converter_raises_recipe_error_without_te():
    import torch

    with pytest.raises(RecipeError, match="transformer_engine"):
        Float8Converter(Fp8Config(enabled=True, backend="te")).convert(torch.nn.Linear(16, 16))


def test_float8_converts_on_the_meta_device():
    import torch

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 30))
    model = Float8Converter(Fp8Config(enabled=True, emulate=True)).convert(model)
    assert type(model[0]).__name__ == "Float8Linear" and type(model[1]) is torch.nn.Linear  # 30 is not a multiple of 16
    assert model[0].weight.is_meta


def test_accelerator_kwargs_map_to_the_configured_backend():
    assert fp8_config_from_accelerator_kwargs({"mixed_precision": "bf16"}) is None
    assert fp8_config_from_accelerator_kwargs(None) is None
    cfg = fp8_config_from_accelerator_kwargs({"mixed_precision": "fp8"})
    assert cfg.enabled and cfg.backend == "torchao"
    assert fp8_config_from_accelerator_kwargs({"mixed_precision": "fp8"}, Fp8Config(backend="te")).backend == "te"
    assert fp8_config_from_accelerator_kwargs({"mixed_precision": "fp8", "fp8_backend": "TE"}).backend == "te"

    class FP8RecipeKwargs:
        backend = "AO"

    got = fp8_config_from_accelerator_kwargs(
        {"mixed_precision": "fp8", "kwargs_handlers": [FP8RecipeKwargs()]}, Fp8Config(backend="te")
    )
    assert got.backend == "torchao"
    with pytest.raises(RecipeError, match="MSAMP"):
        fp8_config_from_accelerator_kwargs({"mixed_precision": "fp8", "fp8_backend": "MSAMP"})
