"""Real CPU trainings measured against their plan (issue 17, item 5), shared by tests/plan and
tools/plan_validate.py (which writes the table in BENCHMARKS.md).

Each run is a fresh spawned process per rank (tests/parallel/harness.py: gloo, one torch thread
per rank), so its peak resident memory starts from nothing: the interpreter and the libraries
`ditty run` imports, then the model. Measured per rank, with ditty.parallel.memory's counters:
parameter bytes (local shards under FSDP), gradient bytes (at the first optimizer step, before it
runs), optimizer-state bytes (after training), and the peak resident set size (VmHWM) at the end
of the last optimizer step, before the final save.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any, Optional

from ditty.config import TrainerConfig
from ditty.config.sections import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PeftConfig,
    QuantConfig,
    RunConfig,
    SchedulerConfig,
    TrainConfig,
)
from tests.parallel.workers import LLAMA_105M

MODELS = {
    # 2 layers, 64 wide, the byte tokenizer's vocabulary: the framework's baseline dominates.
    "tiny": dict(
        vocab_size=259,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    # ~105M parameters, blocks dominating as in real LLMs (tests/parallel/test_memory.py's model).
    "100m": {k: v for k, v in LLAMA_105M.items() if k not in ("max_position_embeddings", "tie_word_embeddings")},
    # The `scale` benchmark's model (tools/bench_scale.py) on one packed row of 16,384 tokens: the
    # activations, not the weights, set the peak, and each of their tensors is 16 MB or more.
    "long": dict(
        vocab_size=259,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    ),
}
SEQ = {"tiny": 128, "100m": 256, "long": 16384}
MICRO = {"long": 1}
"""Rows per micro-batch where it is not 2."""
METHODS = {
    "full": {},
    "lora": dict(peft=PeftConfig(kind="lora", r=8)),
    "qlora": dict(peft=PeftConfig(kind="lora", r=8), quant=QuantConfig(kind="bnb-4bit")),
    "adamw8bit": dict(optimizer=OptimizerConfig(kind="adamw8bit", lr=1e-3)),
}


def save_model(name: str, path: str) -> str:
    """A random Llama of MODELS[name] with the byte tokenizer, saved in Hugging Face format."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ditty.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        **MODELS[name],
        max_position_embeddings=max(512, SEQ[name]),
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def recipe(model: str, model_dir: str, out: str, method: str, world: int = 1, micro: int = 0, steps: int = 2):
    """Packed rows (every micro-batch is micro x max_seq_len real tokens, as the plan assumes), fp32
    on the CPU, `steps` optimizer steps of one micro-batch per rank."""
    micro = micro or MICRO.get(model, 2)
    # enough addition samples (about 9 tokens each) for every step's rows, and some to spare
    samples = max(2000, SEQ[model] * micro * world * (steps + 1) // 8)
    base = TrainerConfig(
        run=RunConfig(name=f"plan-{model}-{method}", output_dir=out, seed=0, device="cpu"),
        model=ModelConfig(path=model_dir),
        data=DataConfig(source="builtin", name="addition", num_samples=samples, max_seq_len=SEQ[model], packing=True),
        train=TrainConfig(
            steps=steps,
            global_batch_size=micro * world,
            micro_batch_size=micro,
            log_every=1,
            eval_every=0,
            eval_samples=0,
        ),
        optimizer=OptimizerConfig(lr=1e-3),
        scheduler=SchedulerConfig(kind="constant"),
        parallel=ParallelConfig(kind="fsdp" if world > 1 else "none"),
        checkpoint=CheckpointConfig(resume="never"),
        logging=LoggingConfig(progress=False),
    )
    options = METHODS[method]
    return replace(base, **{section: value for section, value in options.items()})


def measure(rank: int, world: int, config: TrainerConfig) -> dict[str, int]:
    """Run the Trainer on this rank (called by run_ranks in a fresh process) and count its bytes."""
    from ditty.parallel.memory import gradient_bytes, optimizer_state_bytes, parameter_bytes, peak_rss_bytes
    from ditty.train import Trainer

    trainer = Trainer(config)
    figures: dict[str, int] = {}

    def before_step(optimizer, args, kwargs):
        figures.setdefault("gradients", gradient_bytes(trainer.model.parameters()))

    def after_step(optimizer, args, kwargs):
        figures["peak_rss"] = peak_rss_bytes()

    trainer.optimizer.register_step_pre_hook(before_step)
    trainer.optimizer.register_step_post_hook(after_step)
    trainer.train()
    figures["parameters"] = parameter_bytes(trainer.model)
    figures["optimizer"] = optimizer_state_bytes(trainer.optimizer)
    return figures


@dataclass
class Comparison:
    name: str
    rank: int
    planned: dict[str, int]
    measured: dict[str, int]

    @property
    def peak_error(self) -> float:
        return self.planned["peak_rss"] / self.measured["peak_rss"] - 1

    @property
    def exact(self) -> bool:
        return all(self.planned[k] == self.measured[k] for k in ("parameters", "gradients", "optimizer"))


def planned_figures(config: TrainerConfig, world: int) -> list[dict[str, int]]:
    from ditty.plan import Target, make_plan

    plan = make_plan(config, Target(device="cpu", gpus_per_node=world), with_knobs=False)
    out = []
    for rank in range(world):
        kind = plan.memory.for_rank(rank)
        state = kind.state
        out.append(
            dict(
                parameters=state.parameter_total,
                gradients=state.gradients,
                optimizer=state.optimizer,
                peak_rss=kind.peak,
            )
        )
    return out


def run_case(model: str, model_dir: str, out: str, method: str, world: int = 1, **options: Any) -> list[Comparison]:
    from tests.parallel.harness import run_ranks

    config = recipe(model, model_dir, out, method, world, **options)
    measured = run_ranks(measure, world, config, timeout=900, collective_timeout=300, fresh_interpreters=True)
    planned = planned_figures(config, world)
    name = f"{model} {method}" + (f", fsdp x {world}" if world > 1 else "")
    return [Comparison(name, rank, planned[rank], measured[rank]) for rank in range(world)]


def table(comparisons: list[Comparison]) -> str:
    MB = 2**20
    rows = [
        "| run | rank | parameters (planned = measured, bytes) | gradients | optimizer state | peak RSS planned (MiB) "
        "| peak RSS measured (MiB) | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        cells = []
        for key in ("parameters", "gradients", "optimizer"):
            p, m = c.planned[key], c.measured[key]
            cells.append(f"{m:,}" if p == m else f"planned {p:,} / measured {m:,}")
        rows.append(
            f"| {c.name} | {c.rank} | {' | '.join(cells)} | {c.planned['peak_rss'] / MB:,.0f} | "
            f"{c.measured['peak_rss'] / MB:,.0f} | {c.peak_error:+.1%} |"
        )
    return "\n".join(rows)


def env_memory(run_dir: str) -> Optional[dict]:
    with open(os.path.join(run_dir, "env.json"), encoding="utf-8") as handle:
        return json.load(handle).get("memory")
