"""The plan's arithmetic across parallel kinds, offload and knobs (no torch, no weights)."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from ditty.config import TrainerConfig
from ditty.config.bundled import bundled_recipes
from ditty.config.loader import from_config, load_any
from ditty.config.sections import DataConfig, ModelConfig, OptimizerConfig, ParallelConfig, PeftConfig, TrainConfig
from ditty.plan import Target, make_plan, render, with_changes
from ditty.plan.settings import GiB, parse_memory
from ditty.recipe import compile_recipe

LLAMA_8B = "meta-llama/Meta-Llama-3-8B"


def full_8b(**parallel) -> TrainerConfig:
    return TrainerConfig(
        model=ModelConfig(path=LLAMA_8B, dtype="bfloat16"),
        data=DataConfig(source="hub", name="x", max_seq_len=2048),
        train=TrainConfig(global_batch_size=64, micro_batch_size=1, precision="bf16", activation_checkpointing="full"),
        parallel=ParallelConfig(**parallel),
    )


def state(plan, rank=0):
    return plan.memory.for_rank(rank).state


@pytest.mark.parametrize("recipe", bundled_recipes(), ids=lambda r: r.name)
def test_every_bundled_recipe_plans(recipe, tmp_path, monkeypatch, request):
    from tests.cli.test_cli import stand_in_first_stage

    stand_in_first_stage(recipe.name, tmp_path, monkeypatch, request)
    plan = make_plan(load_any(recipe.name).config, Target(memory=parse_memory("80GB")))
    assert plan.memory.peak > 0 and "memory per rank" in render(plan)


def test_sharding_divides_the_state():
    one = make_plan(full_8b(), Target())
    ddp = make_plan(full_8b(kind="ddp"), Target(gpus_per_node=8))
    fsdp = make_plan(full_8b(kind="fsdp"), Target(gpus_per_node=8))
    hsdp = make_plan(full_8b(kind="hsdp", replicate_size=2), Target(gpus_per_node=8))
    assert state(ddp).parameter_total == state(one).parameter_total  # a whole replica per rank
    for plan, shards in ((fsdp, 8), (hsdp, 4)):
        assert state(plan).parameter_total == pytest.approx(state(one).parameter_total / shards, rel=1e-3)
        assert state(plan).optimizer == pytest.approx(state(one).optimizer / shards, rel=1e-3)
        assert any(r.label == "FSDP gathered parameters" for r in plan.memory.kinds[0].rows)


def test_deepspeed_stages_follow_zero():
    one = state(make_plan(full_8b(), Target()))
    zero2 = state(make_plan(full_8b(kind="deepspeed", zero_stage=2), Target(gpus_per_node=8)))
    zero3 = state(make_plan(full_8b(kind="deepspeed", zero_stage=3), Target(gpus_per_node=8)))
    n = 8_030_261_248
    assert zero2.parameter_total == one.parameter_total == 2 * n  # stage 2 keeps whole 16-bit weights
    assert zero3.parameter_total == pytest.approx(2 * n / 8, rel=1e-3)
    assert zero2.master_weights == pytest.approx(4 * n / 8, rel=1e-3)  # fp32 master partition
    assert zero2.optimizer == pytest.approx(8 * n / 8, rel=1e-3)


def test_offload_moves_state_to_the_host():
    plan = make_plan(full_8b(kind="fsdp", cpu_offload=True), Target(gpus_per_node=8))
    kind = plan.memory.kinds[0]
    assert not any(r.label in ("gradients", "optimizer state") for r in kind.rows)
    assert {r.label for r in kind.host_rows} >= {"gradients", "optimizer state"}
    zero = make_plan(full_8b(kind="deepspeed", zero_stage=3, offload_optimizer=True), Target(gpus_per_node=8))
    assert "optimizer state" in {r.label for r in zero.memory.kinds[0].host_rows}


def test_uneven_shards_make_rank_kinds():
    config = replace(full_8b(kind="fsdp"), model=ModelConfig(path="Qwen/Qwen2.5-0.5B", dtype="bfloat16"))
    plan = make_plan(config, Target(gpus_per_node=3))
    assert len(plan.memory.kinds) > 1  # 896 rows do not split evenly over 3 ranks
    totals = [state(plan, r).parameter_total for r in range(3)]
    assert totals[0] > totals[-1] and sum(totals) == make_plan(config, Target()).memory.kinds[0].state.parameter_total


def test_every_knob_offered_fits_and_compiles():
    config = load_any("mistral_lora").config
    plan = make_plan(config, Target(memory=parse_memory("16GB")), is_valid=lambda c: not _errors(c))
    assert not plan.fits and plan.knobs
    for knob in plan.knobs:
        changed = with_changes(config, knob.changes)
        assert not _errors(changed)
        peak = make_plan(changed, Target(memory=parse_memory("16GB"))).memory.peak
        assert peak == knob.peak and knob.fits == (peak <= 16 * GiB)


def test_knobs_include_checkpointing_for_activation_heavy_plans():
    config = with_changes(full_8b(), {"train.activation_checkpointing": "none", "train.micro_batch_size": 4})
    config = with_changes(config, {"peft.kind": "lora", "train.global_batch_size": 64})
    plan = make_plan(config, Target(memory=parse_memory("40GB")))
    described = [k.describe() for k in plan.knobs]
    assert any('train.activation_checkpointing = "full"' in d for d in described), described


def _errors(config):
    return compile_recipe(from_config(config)).errors


def test_lora_optimizer_state_is_the_adapters_only():
    config = replace(full_8b(), peft=PeftConfig(kind="lora", r=16), optimizer=OptimizerConfig())
    s = state(make_plan(config, Target()))
    adapters = s.parameters["LoRA adapters (float32)"]
    assert s.gradients == adapters and s.optimizer == 2 * adapters + 4 * (2 * 7 * 32)  # moments + step per tensor


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")


def _cpu_plan(monkeypatch, env: dict, kind: str = "none", world: int = 1, micro: int = 64):
    """tiny_sft (4 layers, 128 wide, MLP 256, 4 heads, rows of 32 tokens) planned for the CPU under `env`."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = load_any("tiny_sft").config
    train = replace(config.train, micro_batch_size=micro, global_batch_size=max(1024, micro * world))
    config = replace(config, train=train, parallel=ParallelConfig(kind=kind))
    rows = make_plan(config, Target(device="cpu", gpus_per_node=world)).memory.for_rank(0).rows
    kept = sum(row.bytes for row in rows if row.label == "CPU heap kept from the previous step")
    return kept, sum(row.bytes for row in rows if row.kind == "activations")


@linux_only
@pytest.mark.parametrize(
    "env, kind, world",
    [
        ({}, "none", 1),  # glibc's defaults: its heap serves every tensor under 32 MB
        ({"DITTY_CPU_ALLOCATOR": "return", "MALLOC_ARENA_MAX": "2"}, "none", 1),  # the user's glibc policy
        ({"DITTY_CPU_ALLOCATOR": "glibc"}, "fsdp", 2),
    ],
)
def test_glibc_keeps_a_step_of_small_activations_in_its_heap(monkeypatch, no_allocator_settings, env, kind, world):
    kept, activations = _cpu_plan(monkeypatch, env, kind, world)
    assert kept == activations > 0  # 64 x 32 tokens: every tensor is 2 MB or less


@linux_only
@pytest.mark.parametrize("env, kind, world", [({"DITTY_CPU_ALLOCATOR": "return"}, "none", 1), ({}, "fsdp", 2)])
def test_where_freed_memory_goes_back_only_tensors_under_2_mb_stay(
    monkeypatch, no_allocator_settings, env, kind, world
):
    # 256 x 32 = 8,192 tokens per rank: the 128-wide tensors are 4 MB and go back when freed. What
    # stays in the heap, per token: per block two RMSNorms' reciprocal RMS (4 bytes each), the
    # log-sum-exp of 4 heads (16) and the padding mask (32 keys x 4 bytes); outside the blocks the
    # ids, labels, mask and positions (4 x 8) and the final norm's reciprocal RMS (4). The logits
    # (8,192 x 259 x 4 bytes, 8.5 MB) are mapped too.
    kept, activations = _cpu_plan(monkeypatch, env, kind, world, micro=256)
    assert kept == 8192 * (4 * (4 + 4 + 16 + 128) + 32 + 4)
    assert kept < 0.05 * activations


@linux_only
def test_on_long_rows_glibc_maps_the_tensors_over_32_mb(monkeypatch, no_allocator_settings):
    # 1,024 x 32 = 32,768 tokens: the MLP's 256-wide tensors are 32 MB and the logits 34 MB, mapped
    # even under glibc's dynamic threshold; the 128-wide ones (16 MB) stay in its heap.
    kept, activations = _cpu_plan(monkeypatch, {}, micro=1024)
    ours, _ = _cpu_plan(monkeypatch, {"DITTY_CPU_ALLOCATOR": "return"}, micro=1024)
    assert 0 < ours < kept < activations
    mlp = 32768 * 4 * (4 * 256 * 4)  # per block: gate, up, activation and down_proj's input, fp32
    assert kept == pytest.approx(activations - mlp - 32768 * 259 * 16, rel=0.01)
