"""`ditty check --plan` counts what an objective adds: the preference reference (none with an adapter,
a frozen copy on a full finetune, a path's parameters, sharded like the policy under FSDP; nothing while
training with "precompute") and GRPO's rollout KV cache and KL reference."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ditty.config.rl import RLConfig
from ditty.config.sections import ParallelConfig, PeftConfig
from ditty.plan import Target, make_plan
from tests.preference.test_loss import _config

TINY_PARAMETERS = 107_200  # the session's tiny Llama (tests/conftest.py): 2 layers, 64 wide, 259 tokens


def _reference_row(plan, rank=0):
    return next(row for row in plan.memory.for_rank(rank).rows if row.label == "reference model")


def _plan(config, gpus=1):
    target = Target(device="cpu") if gpus == 1 else Target(device="cuda", gpus_per_node=gpus)
    return make_plan(config, target, with_knobs=False)


def test_a_full_finetune_holds_a_frozen_copy_and_an_adapter_none(tmp_path, tiny_llama_dir):
    config = _config(tmp_path, tiny_llama_dir, "dpo")
    copy = _reference_row(_plan(config))
    assert copy.bytes == TINY_PARAMETERS * 4 and "frozen copy" in copy.note and "whole" in copy.note
    adapter = _reference_row(_plan(replace(config, peft=PeftConfig(kind="lora", r=4, alpha=8))))
    assert adapter.bytes == 0 and "adapter disabled" in adapter.note
    precompute = _reference_row(_plan(replace(config, preference=replace(config.preference, reference="precompute"))))
    assert precompute.bytes == 0 and "none while training" in precompute.note


def test_under_fsdp_the_copy_is_sharded_like_the_policy(tmp_path, tiny_llama_dir):
    config = replace(_config(tmp_path, tiny_llama_dir, "dpo"), parallel=ParallelConfig(kind="fsdp"))
    plan = _plan(config, gpus=2)
    shards = [_reference_row(plan, rank).bytes for rank in (0, 1)]
    assert sum(shards) == TINY_PARAMETERS * 4 and max(shards) < TINY_PARAMETERS * 4 * 0.6
    assert "sharded over 2 ranks" in _reference_row(plan).note


def test_a_reference_path_counts_its_own_parameters(tmp_path, tiny_llama_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    larger = AutoConfig.from_pretrained(tiny_llama_dir)
    larger.num_hidden_layers = 5
    directory = tmp_path / "reference"
    larger.save_pretrained(directory)
    expected = AutoModelForCausalLM.from_config(larger).num_parameters()
    config = _config(tmp_path, tiny_llama_dir, "dpo", reference=str(directory))
    row = _reference_row(_plan(config))
    assert row.bytes == expected * 4 and str(directory) in row.note
    sharded = _plan(replace(config, parallel=ParallelConfig(kind="fsdp")), gpus=2)
    assert _reference_row(sharded).bytes == -(-expected // 2) * 4


def test_pairs_are_two_rows_through_the_forward(tmp_path, tiny_llama_dir):
    config = _config(tmp_path, tiny_llama_dir, "dpo")
    plan = _plan(replace(config, train=replace(config.train, micro_batch_size=2)))
    assert plan.settings.micro_batch == 4
    assert any(row.label.startswith("activations (4 x 32 tokens") for row in plan.memory.kinds[0].rows)


@pytest.mark.parametrize("peft", ["none", "lora"])
def test_grpo_counts_the_rollouts_kv_cache_and_the_reference(tmp_path, tiny_llama_dir, peft):
    config = _config(tmp_path, tiny_llama_dir, "dpo")
    rl = RLConfig(kind="grpo", group_size=4, beta=0.1, rewards=["x:y"])
    rollout = replace(config.rollout, max_new_tokens=16)
    config = replace(config, rl=rl, rollout=rollout, data=replace(config.data, format="prompt"))
    if peft == "lora":
        config = replace(config, peft=PeftConfig(kind="lora", r=4, alpha=8))
    rows = {row.label: row for row in _plan(config).memory.kinds[0].rows}
    # 8 completions = 2 prompts x group of 4, each (32 prompt + 16 new) tokens, 2 layers, K and V,
    # 2 kv heads of 16 dimensions, float32
    assert rows["rollouts' KV cache"].bytes == 8 * 48 * 2 * 2 * 2 * 16 * 4
    assert "8 completions in flight" in rows["rollouts' KV cache"].note
    reference = rows["reference model"]
    assert reference.bytes == (0 if peft == "lora" else TINY_PARAMETERS * 4)
    no_kl = {row.label for row in _plan(replace(config, rl=replace(rl, beta=0.0))).memory.kinds[0].rows}
    assert "reference model" not in no_kl and "rollouts' KV cache" in no_kl


def test_under_tp_a_rank_samples_its_data_parallel_share_with_its_own_heads(tmp_path, tiny_llama_dir):
    """tp 2 x dp 2 on 4 GPUs: a tp group shares its prompts (1 of the step's 2 prompts per data-parallel
    rank, 4 completions) and each rank caches the keys and values of its own kv heads (1 of 2)."""
    config = _config(tmp_path, tiny_llama_dir, "dpo")
    rl = RLConfig(kind="grpo", group_size=4, rewards=["x:y"])
    config = replace(
        config,
        rl=rl,
        rollout=replace(config.rollout, max_new_tokens=16),
        data=replace(config.data, format="prompt"),
        parallel=ParallelConfig(kind="fsdp", tp=2),
    )
    rows = {row.label: row for row in _plan(config, gpus=4).memory.kinds[0].rows}
    assert rows["rollouts' KV cache"].bytes == 4 * 48 * 2 * 2 * 1 * 16 * 4
    assert (
        "4 completions in flight" in rows["rollouts' KV cache"].note
        and "2 / tp 2 kv heads" in rows["rollouts' KV cache"].note
    )


def test_check_plan_prints_the_reference_line(capsys, tmp_path, tiny_llama_dir):
    from ditty.cli import main
    from tests.preference.recipes import preference_recipe, write_pairs

    recipe = preference_recipe(tmp_path, tiny_llama_dir, write_pairs(tmp_path / "p.jsonl"))
    code = main(["check", str(recipe), "--plan", "--preference.reference", "precompute"])
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(line for line in out.splitlines() if line.strip().startswith("reference model"))
    assert "0.00" in line and "none while training" in line
    assert "(at most: global batch x 2 rows a pair x max_seq_len)" in out


def test_the_time_counts_both_rows_of_a_pair_and_the_reference_forward(tmp_path, tiny_llama_dir):
    from ditty.plan.timing import flops_per_token

    config = _config(tmp_path, tiny_llama_dir, "dpo")
    plan = _plan(config)
    s, held = plan.settings, plan.memory.held
    tokens = config.train.global_batch_size * 2 * config.data.max_seq_len
    assert plan.time.tokens_per_step == tokens
    attention = 2 * s.seq_len * plan.shape.q_dim * plan.shape.num_layers
    forward = 2 * sum(t.numel for t in held if t.matmul) + attention
    assert plan.time.flops_per_step == pytest.approx(tokens * (flops_per_token(plan.shape, s, held) + forward))
    precompute = _plan(replace(config, preference=replace(config.preference, reference="precompute")))
    assert precompute.time.flops_per_step == pytest.approx(tokens * flops_per_token(plan.shape, s, held))
