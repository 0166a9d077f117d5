"""ditty's table of tensor-parallel plans agrees with the plans transformers ships in each config."""

from __future__ import annotations

import pytest

from ditty.parallel.tp_table import DITTY_TP_PLANS, STYLES, TP_MODEL_TYPES, tp_plan_of


@pytest.mark.parametrize("model_type", TP_MODEL_TYPES)
def test_ditty_table_matches_the_config_plan(model_type):
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    assert dict(config.base_model_tp_plan) == DITTY_TP_PLANS[model_type]
    assert set(tp_plan_of(config).values()) <= set(STYLES)


def test_a_config_without_a_plan_takes_ditty_table():
    class Bare:
        model_type = "llama"
        base_model_tp_plan = None

    assert tp_plan_of(Bare()) == DITTY_TP_PLANS["llama"]
