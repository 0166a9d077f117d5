"""The tensor-parallel plans (ditty's table against transformers' own), what the builder refuses, and the
loss's re-entrant vocabulary-parallel handlers: fast checks without processes."""

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


def test_plan_patterns_match_one_path_part_per_star():
    from ditty.parallel.tensor import _clean, _matches

    assert _matches("layers.0.self_attn.q_proj", "layers.*.self_attn.q_proj")
    assert not _matches("layers.0.self_attn.q_proj.lora_A", "layers.*.self_attn.q_proj")
    assert _matches(_clean("layers.1._checkpoint_wrapped_module.mlp.down_proj"), "layers.*.mlp.down_proj")


def _meta_model(model_type: str, **overrides):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=64)
    if model_type == "gpt2":
        sizes = dict(n_embd=32, n_layer=1, n_head=4, vocab_size=64)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**sizes, **overrides}))


def test_the_builder_refuses_what_the_compiler_could_not_read_offline():
    from ditty.config.errors import RecipeError
    from ditty.parallel.tensor import check_tensor_parallel_model

    with pytest.raises(RecipeError, match="plans for llama, mistral, qwen2, qwen3"):
        check_tensor_parallel_model(_meta_model("gpt2"))
    # tied embeddings split once: the head shares the embedding's rows (test_vocab_parallel_logps.py)
    tied = _meta_model("llama", tie_word_embeddings=True)
    assert check_tensor_parallel_model(tied).model_type == "llama"


def test_vocabulary_rows_are_torch_chunk_pieces():
    import torch

    from ditty.parallel.tp_table import vocabulary_rows

    for vocab, tp in ((259, 2), (259, 4), (259, 8), (151936, 8), (10, 4), (5, 4)):
        assert vocabulary_rows(vocab, tp) == [len(piece) for piece in torch.arange(vocab).chunk(tp)] + [0] * (
            tp - len(torch.arange(vocab).chunk(tp))
        )
    assert vocabulary_rows(259, 2) == [130, 129] and vocabulary_rows(259, 4) == [65, 65, 65, 64]
    assert vocabulary_rows(5, 4) == [2, 2, 1, 0]  # a rank without rows: the compiler refuses this tp


def test_vocab_parallel_is_reentrant():
    """torch's loss_parallel switches DTensor's loss handlers off at any exit; the engine holds them
    around a whole micro-batch while the loss enters again inside."""
    import torch
    from torch.distributed.tensor import DTensor

    from ditty.stages.vocab_parallel import vocab_parallel

    handlers = DTensor._op_dispatcher._custom_op_handlers
    log_softmax = torch.ops.aten._log_softmax.default
    assert log_softmax not in handlers
    with vocab_parallel():
        with vocab_parallel():
            assert log_softmax in handlers
        assert log_softmax in handlers  # the inner exit left them on
    assert log_softmax not in handlers
    with pytest.raises(ValueError), vocab_parallel():
        raise ValueError("a failing loss")
    assert log_softmax not in handlers  # and an error turns them off


def test_tensor_parallel_groups_read_the_same_evaluation_batches(monkeypatch):
    from ditty._utils import dist

    monkeypatch.setattr(dist, "world_size", lambda: 8)
    dist.set_batch_replicas(2)
    try:
        shards = []
        for rank in range(8):
            monkeypatch.setattr(dist, "rank", lambda r=rank: r)
            shards.append(dist.batch_shard())
    finally:
        dist.set_batch_replicas(1)
    assert shards == [(0, 4), (0, 4), (1, 4), (1, 4), (2, 4), (2, 4), (3, 4), (3, 4)]
