"""Plans at scale with tensor and context parallel: `ditty check --plan --gpus 64/256` checks the
recipe's tp/cp (per-rank memory, time, the collectives' traffic) or chooses them when the recipe does
not fit; and the published configurations of torchtitan and axolotl, planned as ditty recipes.
`python -m tests.plan.test_scale_plan` prints the comparison table of BENCHMARKS.md."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from ditty.config import TrainerConfig
from ditty.config.sections import (
    DataConfig,
    ModelConfig,
    ParallelConfig,
    PeftConfig,
    RunConfig,
    TokenizerConfig,
    TrainConfig,
)
from ditty.plan import Target, make_plan
from ditty.plan.settings import GiB

H100 = 80 * GiB
QWEN3_8B = dict(
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=False,
)
LLAMA_70B, LLAMA_8B = "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-8B"


def recipe(model: str, seq: int, micro: int, global_batch: int, *, tp: int = 1, cp: int = 1, lora: bool = False):
    return TrainerConfig(
        run=RunConfig(device="cuda"),
        model=ModelConfig(path=model, dtype="bfloat16"),
        data=DataConfig(source="hub", name="peer", max_seq_len=seq, packing=True),
        train=TrainConfig(
            steps=100,
            micro_batch_size=micro,
            global_batch_size=global_batch,
            precision="bf16",
            activation_checkpointing="full",
        ),
        parallel=ParallelConfig(kind="fsdp", tp=tp, cp=cp),
        peft=PeftConfig(kind="lora", r=16) if lora else PeftConfig(),
    )


def target(gpus: int, memory: int = H100) -> Target:
    return Target(device="cuda", gpus_per_node=8, nodes=gpus // 8, memory=memory, gpu="H100")


def training_peak(plan) -> int:
    """The largest rank's bytes while training. The load phase is left out: a hub id that is not a local
    directory makes every rank build the whole model before FSDP2 shards it (the plan says so); from a
    local directory rank 0 streams it, as torchtitan's meta-device initialisation never holds it whole."""
    return max(kind.total for kind in plan.memory.kinds)


def is_valid(world: int):
    from ditty.config.loader import from_config
    from ditty.recipe import compile_recipe

    return lambda config: not compile_recipe(from_config(config), world_size=world).errors


def test_a_70b_full_finetune_on_256_gpus_with_tp_8_fits_and_says_its_traffic():
    plan = make_plan(recipe(LLAMA_70B, 8192, 16, 512, tp=8), target(256), is_valid=is_valid(256))
    from ditty.plan import render

    text = render(plan)
    assert "fsdp over dp 32 x cp 1 = 32 rank(s), tensor parallel 8" in text
    assert "tp/cp traffic" in text and "warning: tp x cp" not in text
    state = plan.memory.kinds[0].state
    # every parameter split 8 ways by tensor parallel, then 32 by FSDP2 (norms: 32 only, a rounding error)
    assert state.parameter_total == pytest.approx(2 * plan.shape.parameter_count / 256, rel=0.01)
    assert training_peak(plan) <= H100
    seconds = plan.time.seconds_per_step
    assert seconds is not None and 500 < plan.time.tokens_per_step / seconds / 256 < 800  # tokens/s per GPU


def test_a_128k_lora_that_does_not_fit_gets_context_parallel_chosen():
    plan = make_plan(recipe(LLAMA_8B, 131072, 1, 8, lora=True), target(64), is_valid=is_valid(64))
    assert training_peak(plan) > H100
    fitting = [k.changes for k in plan.knobs if k.fits]
    assert {"parallel.kind": "fsdp", "parallel.cp": 8} in fitting
    chosen = make_plan(recipe(LLAMA_8B, 131072, 1, 8, lora=True, cp=8), target(64), is_valid=is_valid(64))
    assert training_peak(chosen) <= H100
    activations = lambda p: next(r.bytes for r in p.memory.kinds[0].rows if r.kind == "activations")  # noqa: E731
    assert activations(chosen) == pytest.approx(activations(plan) / 8, rel=0.01)


def test_tensor_parallel_is_chosen_inside_a_node_only():
    config = recipe(LLAMA_70B, 8192, 4, 256)
    plan = make_plan(config, target(64), is_valid=is_valid(64))
    degrees = [k.changes.get("parallel.tp") for k in plan.knobs]
    assert all(tp in (None, 2, 4, 8) for tp in degrees)  # never past the 8 GPUs of a node
    spread = make_plan(replace(config, parallel=ParallelConfig(kind="fsdp", tp=8, cp=2)), target(64))
    from ditty.plan import render

    assert "warning: tp x cp = 16 ranks span nodes" in render(spread)


def test_ditty_check_plan_on_64_gpus_prints_the_mesh_and_each_rank(tmp_path, capsys):
    from ditty.cli import main

    path = tmp_path / "r.toml"
    path.write_text(
        f'[model]\npath = "{LLAMA_70B}"\ndtype = "bfloat16"\n[data]\nsource = "hub"\nname = "c4"\nmax_seq_len = 8192\n'
        '[train]\nglobal_batch_size = 64\nmicro_batch_size = 8\nprecision = "bf16"\nactivation_checkpointing = "full"\n'
        'loss_chunks = 8\n[parallel]\nkind = "fsdp"\ntp = 8\n'
    )
    assert main(["check", str(path), "--plan", "--gpus", "8", "--nodes", "8", "--gpu-memory", "H100"]) == 0
    out = capsys.readouterr().out
    assert "fsdp mesh (dp 8 x tp 8)" in out and "fsdp over dp 8 x cp 1 = 8 rank(s), tensor parallel 8" in out
    assert "ranks 0-63" in out and "time per step" in out and "tp/cp traffic" in out


# ------------------------------------------------------------------ published figures, planned

TORCHTITAN = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md (H100 96GB HBM2e, 500 W)"
TORCHTITAN_ASYNC_TP = "torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"
AXOLOTL = "axolotl docs/nd_parallelism.qmd and examples/distributed-parallel (configurations, no figures)"


@dataclass(frozen=True)
class Published:
    source: str
    setup: str
    config: TrainerConfig
    gpus: int
    memory_gib: float | None
    tokens_per_gpu_s: float | None
    note: str
    device_memory: int = H100
    """torchtitan's H100s carry 96 GB of HBM2e (its benchmark's hardware section), not 80."""


PUBLISHED = [
    Published(
        TORCHTITAN,
        "Table 4: Llama 3.1 70B, 256 GPUs, FSDP 32 x TP 8, local batch 16 x 8,192, full AC, compile + float8",
        recipe(LLAMA_70B, 8192, 16, 512, tp=8),
        256,
        71.9,
        829,
        "ditty plans bf16 (it refuses float8 with tp) without compile; full logits",
        96 * GiB,
    ),
    Published(
        TORCHTITAN_ASYNC_TP,
        "Llama 3 70B, 256 H100, FSDP 32 x TP 8, local batch 16, full AC, compile, bf16, vanilla TP",
        recipe(LLAMA_70B, 8192, 16, 512, tp=8),
        256,
        None,
        597.3,
        "the same set-up in bf16: the figure the plan's 40% utilisation should be read against",
        96 * GiB,
    ),
    Published(
        TORCHTITAN,
        "Table 2: Llama 3.1 8B, 8 GPUs, FSDP 2 x CP 4, 131,072 tokens, local batch 1, full AC, compile + float8",
        recipe(LLAMA_8B, 131072, 1, 2, cp=4),
        8,
        84.0,
        1071,
        "full training, ring attention (torch's CP); ditty plans Ulysses in bf16, full logits",
        96 * GiB,
    ),
    Published(
        AXOLOTL,
        "Qwen3 8B, 8 GPUs, dp_shard 2 x tp 2 x cp 2, 8,192 tokens, micro-batch 1 (examples/distributed-parallel)",
        replace(
            recipe("Qwen/Qwen3-8B", 8192, 1, 2, tp=2, cp=2),
            # Qwen3-8B's public config.json, which ditty's table of known models does not hold
            model=ModelConfig(architecture="qwen3", init="random", dtype="bfloat16", config=QWEN3_8B),
            tokenizer=TokenizerConfig(path="Qwen/Qwen3-8B"),
        ),
        8,
        None,
        None,
        "a published configuration, no figure: planned to show what it holds per rank",
    ),
    Published(
        "ditty (no published peer figure)",
        "Llama 3.1 8B LoRA r=16, 128k tokens (131,072), 8 GPUs, cp 8, chunked loss, full AC",
        replace(
            recipe(LLAMA_8B, 131072, 1, 1, cp=8, lora=True),
            train=replace(recipe(LLAMA_8B, 131072, 1, 1).train, loss_chunks=8),
        ),
        8,
        None,
        None,
        "the 128k LoRA finetune: axolotl's README and docs show such configurations without figures",
    ),
]


def planned(row: Published):
    return make_plan(row.config, target(row.gpus, row.device_memory), with_knobs=False)


@pytest.mark.parametrize("row", PUBLISHED, ids=lambda r: r.setup[:40])
def test_published_configurations_plan_and_fit(row):
    plan = planned(row)
    assert training_peak(plan) <= row.device_memory, training_peak(plan) / GiB
    if row.memory_gib is not None:  # within a quarter: float8, compile and ring attention differ (see notes)
        assert abs(training_peak(plan) / GiB / row.memory_gib - 1) < 0.25


def table() -> str:
    lines = [
        "| source | set-up | published memory | planned (training) | published tokens/s/GPU | planned tokens/s/GPU "
        "| note |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in PUBLISHED:
        plan = planned(row)
        speed = plan.time.tokens_per_step / plan.time.seconds_per_step / row.gpus
        memory = f"{row.memory_gib} GiB" if row.memory_gib is not None else "-"
        rate = f"{row.tokens_per_gpu_s:,}" if row.tokens_per_gpu_s is not None else "-"
        lines.append(
            f"| {row.source} | {row.setup} | {memory} | {training_peak(plan) / GiB:.1f} GiB | {rate} | {speed:,.0f} | "
            f"{row.note} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
