"""The DeepSpeed engine config built from [parallel] (pure; the engine runs in tests/train/test_deepspeed_run.py)."""

from __future__ import annotations

import builtins

import pytest

from ditty.config.errors import RecipeError
from ditty.config.sections import ParallelConfig
from ditty.parallel.deepspeed import INSTALL_HINT, deepspeed_config, deepspeed_problems, require_deepspeed


def build(**kw):
    extra = {k: kw.pop(k) for k in ("precision", "max_grad_norm", "pin_memory") if k in kw}
    return deepspeed_config(
        ParallelConfig(kind="deepspeed", **kw), micro_batch_size=4, accumulation_steps=2, world_size=2, **extra
    )


def test_zero2_with_optimizer_offload():
    config = build(zero_stage=2, offload_optimizer=True, max_grad_norm=1.0)
    assert config["train_micro_batch_size_per_gpu"] == 4
    assert config["gradient_accumulation_steps"] == 2
    assert config["train_batch_size"] == 16
    assert config["gradient_clipping"] == 1.0
    assert config["zero_optimization"]["stage"] == 2
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert "offload_param" not in config["zero_optimization"]
    assert config["zero_allow_untested_optimizer"] and config["zero_force_ds_cpu_optimizer"] is False
    assert not config["bf16"]["enabled"] and not config["fp16"]["enabled"]


def test_zero3_with_parameter_offload_and_bf16():
    config = build(zero_stage=3, offload_params=True, precision="bf16", pin_memory=True)
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert "offload_optimizer" not in zero and "zero_force_ds_cpu_optimizer" not in config
    assert config["bf16"]["enabled"] and "gradient_clipping" not in config


def test_parameter_offload_needs_stage_3():
    parallel = ParallelConfig(kind="deepspeed", zero_stage=2, offload_params=True)
    assert [p.key for p in deepspeed_problems(parallel)] == ["parallel.offload_params"]
    with pytest.raises(RecipeError, match="only ZeRO stage 3"):
        build(zero_stage=2, offload_params=True)
    assert deepspeed_problems(ParallelConfig(kind="fsdp", offload_params=True)) == []


def test_missing_deepspeed_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_deepspeed(name, *args, **kwargs):
        if name == "deepspeed":
            raise ImportError("No module named 'deepspeed'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_deepspeed)
    with pytest.raises(RecipeError) as caught:
        require_deepspeed()
    assert INSTALL_HINT in str(caught.value) and caught.value.problems[0].key == "parallel.kind"
