"""The Trainer on several processes (gloo on CPU): parity with one process, final/ under FSDP, failure,
memory, LoRA and 8-bit AdamW under FSDP, several "nodes" on localhost.

Multi-process tests are slow (each rank imports torch and transformers on 2 shared cores) and share
one spawn per scenario. Parity settings: fp32, no dropout, the same seed and global batch of 8.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

from ditty.config import TrainerConfig
from ditty.config.sections import (
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    RunConfig,
    SchedulerConfig,
    TokenizerConfig,
    TrainConfig,
)
from tests.parallel.harness import free_port, run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLERANCE = 1e-5
STEPS = 8
TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


def tiny_config(
    out: str, *, micro: int, parallel: str = "none", steps: int = STEPS, **parallel_options
) -> TrainerConfig:
    return TrainerConfig(
        run=RunConfig(name="dist", output_dir=out, seed=0, device="cpu"),
        model=ModelConfig(init="random", architecture="llama", config=dict(TINY)),
        tokenizer=TokenizerConfig(kind="byte"),
        data=DataConfig(
            source="builtin",
            name="addition",
            format="prompt_completion",
            max_seq_len=32,
            num_samples=200,
            val_fraction=0.05,
        ),
        train=TrainConfig(
            steps=steps,
            global_batch_size=8,
            micro_batch_size=micro,
            max_grad_norm=1.0,
            log_every=1,
            eval_every=0,
            eval_samples=3,
        ),
        optimizer=OptimizerConfig(lr=3e-3),
        scheduler=SchedulerConfig(kind="constant"),
        parallel=ParallelConfig(kind=parallel, **parallel_options),
        logging=LoggingConfig(progress=False),
    )


def losses(run_dir: str) -> list[float]:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [r["loss"] for r in map(json.loads, f) if "loss" in r]


def final_weights(run_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(run_dir, "final", "model.safetensors"))


def relative_error(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b)
    return (num / sum(float(b[k].double().pow(2).sum()) for k in b)) ** 0.5


def loss_error(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def _train_all(rank: int, world: int, configs: list) -> list:
    """One spawn, several runs in turn; returns rank 0's memory figures from env.json."""
    from ditty.train import Trainer

    for config in configs:
        Trainer(config).train()
    return None


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process, no torch.distributed: the reference (accumulation 2 of micro-batches of 4)."""
    from ditty.train import Trainer

    out = str(tmp_path_factory.mktemp("single") / "run")
    Trainer(tiny_config(out, micro=4)).train()
    return out


# ------------------------------------------------------------------ fast (one process)


def test_eval_batches_are_equal_in_number_on_every_rank(monkeypatch):
    from ditty._utils import dist
    from ditty.data.collate import eval_batches
    from ditty.data.formats.base import PaddingCollator

    data = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]} for _ in range(5)]
    counts, tokens = [], 0
    for rank in range(2):
        monkeypatch.setattr(dist, "rank", lambda r=rank: r)
        monkeypatch.setattr(dist, "world_size", lambda: 2)
        batches = list(eval_batches(data, 2, PaddingCollator(pad_token_id=0)))
        counts.append(len(batches))
        tokens += sum(int((b["labels"][..., 1:] != -100).sum()) for b in batches)
    assert counts == [2, 2]  # 3 samples on rank 0, 2 on rank 1 (plus one filler batch)
    assert tokens == 5 * 2  # the filler adds no supervised tokens


def test_single_process_reports_memory(single):
    with open(os.path.join(single, "env.json"), encoding="utf-8") as f:
        memory = json.load(f)["memory"]
    assert memory["parameter_bytes_per_rank"] > 0 and memory["optimizer_state_bytes_per_rank"] > 0
    with open(os.path.join(single, "metrics.jsonl"), encoding="utf-8") as f:
        assert all(r["peak_mem_mb"] > 0 for r in map(json.loads, f) if "loss" in r)


# ------------------------------------------------------------------ several processes


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_ddp_and_fsdp_on_two_ranks_match_one_process(single, tmp_path):
    # 2 ranks x 2 micro-batches of 2 = the reference's 2 x 4: gradients sync on the last micro-batch only.
    ddp, fsdp = str(tmp_path / "ddp"), str(tmp_path / "fsdp")
    started = time.monotonic()
    run_ranks(
        _train_all,
        2,
        [tiny_config(ddp, micro=2, parallel="ddp"), tiny_config(fsdp, micro=2, parallel="fsdp")],
        timeout=300,
    )
    print(f"ddp + fsdp on 2 ranks: {time.monotonic() - started:.0f} s")
    ref_losses, ref_weights = losses(single), final_weights(single)
    for run in (ddp, fsdp):
        loss_err, weight_err = loss_error(losses(run), ref_losses), relative_error(final_weights(run), ref_weights)
        print(f"{os.path.basename(run)}: max relative loss error {loss_err:.2e}, final weights {weight_err:.2e}")
        assert loss_err < TOLERANCE and weight_err < TOLERANCE
    memory = {}
    for run in (single, fsdp):
        with open(os.path.join(run, "env.json"), encoding="utf-8") as f:
            figures = json.load(f)["memory"]
        memory[run] = figures["parameter_bytes_per_rank"] + figures["optimizer_state_bytes_per_rank"]
    ratio = memory[fsdp] / memory[single]
    print(f"fsdp per-rank parameter + optimizer-state bytes: {ratio:.3f} of one process")
    assert ratio <= 0.55


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_hsdp_on_four_ranks_matches_one_process(single, tmp_path):
    # replicate 2 x shard 2; 4 ranks x 2 micro-batches of 1.
    hsdp = str(tmp_path / "hsdp")
    started = time.monotonic()
    run_ranks(_train_all, 4, [tiny_config(hsdp, micro=1, parallel="hsdp", replicate_size=2)], timeout=400)
    print(f"hsdp on 4 ranks: {time.monotonic() - started:.0f} s")
    loss_err, weight_err = (
        loss_error(losses(hsdp), losses(single)),
        relative_error(final_weights(hsdp), final_weights(single)),
    )
    print(f"hsdp: max relative loss error {loss_err:.2e}, final weights {weight_err:.2e}")
    assert loss_err < TOLERANCE and weight_err < TOLERANCE


# ------------------------------------------------------------------ through `ditty run` (torchrun)


def write_recipe(path, config: TrainerConfig, pipeline: bool = False) -> str:
    from ditty.config.sections import ComponentSpec, PipelineConfig
    from ditty.config.writer import recipe_to_toml

    if pipeline:
        config = replace(
            config, pipeline=PipelineConfig(preprocessors=[ComponentSpec(use="tests.train.dist_hooks:FailAt")])
        )
    path.write_text(recipe_to_toml(config, comments=False))
    return str(path)


def ditty(*args: str, env: dict | None = None, timeout: int = 300, wait: bool = True):
    # THP_MEM_ALLOC_ENABLE is the launcher's to set (tests assert it does)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DITTY_TEST_") and k != "THP_MEM_ALLOC_ENABLE"}
    # Short collective timeout: a lost peer ends the run in seconds, not minutes.
    full_env.update(OMP_NUM_THREADS="1", PYTHONPATH=REPO, DITTY_DIST_TIMEOUT_S="30", **(env or {}))
    command = [sys.executable, "-m", "ditty", *args]
    if not wait:
        return subprocess.Popen(
            command, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


def logits(final_dir: str, prompt: str = "12+47=") -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(final_dir).eval()
    ids = torch.tensor([[ord(c) % 256 for c in prompt]])
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_tiny_sft_on_two_fsdp_ranks_saves_a_final_model_matching_one_process(tmp_path):
    common = [
        "--train.steps",
        "6",
        "--scheduler.warmup_steps",
        "2",
        "--train.micro_batch_size",
        "32",
        "--train.eval_samples",
        "8",
        "--train.log_every",
        "1",
        "--logging.progress",
        "false",
    ]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    started = time.monotonic()
    done = ditty(
        "run",
        "recipes/tiny_sft.toml",
        "--nproc-per-node",
        "2",
        "--parallel.kind",
        "fsdp",
        "--run.output_dir",
        two,
        *common,
    )
    print(f"tiny_sft, 2 fsdp ranks, 6 steps: {time.monotonic() - started:.0f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    # the workers returned freed memory (ditty's default for fsdp on the CPU) with torch's huge pages
    assert "without torch's huge pages" not in done.stderr
    done = ditty("run", "recipes/tiny_sft.toml", "--run.output_dir", one, *common)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = logits(os.path.join(two, "final")), logits(os.path.join(one, "final"))
    error = float((a - b).abs().max() / b.abs().max())
    print(f"tiny_sft final/ logits, fsdp 2 ranks vs 1 process: max relative difference {error:.2e}")
    assert error < 1e-4
    assert loss_error(losses(two), losses(one)) < TOLERANCE
    with open(os.path.join(two, "metrics.jsonl"), encoding="utf-8") as f:
        record = json.loads(f.readline())
    assert record["peak_mem_mb"] > 0 and record["tokens_per_s"] > 0


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
@pytest.mark.parametrize("kind", ["crash", "user"])
def test_one_failing_rank_ends_every_rank_quickly_with_its_error(tmp_path, kind):
    recipe = write_recipe(
        tmp_path / "r.toml", tiny_config(str(tmp_path / "run"), micro=2, parallel="fsdp", steps=50), pipeline=True
    )
    started = time.monotonic()
    done = ditty(
        "run",
        recipe,
        "--nproc-per-node",
        "2",
        timeout=120,
        env={"DITTY_TEST_FAIL_AT": "1:2" + (":user" if kind == "user" else "")},
    )
    elapsed = time.monotonic() - started
    print(f"{kind} on rank 1: exit {done.returncode} after {elapsed:.0f} s")
    assert elapsed < 60
    if kind == "user":
        assert done.returncode == 2
        assert "injected user error on rank 1" in done.stderr
        assert "Traceback" not in done.stderr.split("injected user error")[-1]
    else:
        assert done.returncode == 1
        assert "rank 1 failed first: RuntimeError: injected failure on rank 1 at step 2" in done.stderr
    assert not os.path.exists(tmp_path / "run" / "final")


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_two_nodes_on_localhost_run_hsdp_matching_one_process(single, tmp_path):
    # Two torchrun node groups joined by c10d rendezvous, 2 ranks each: replicate across the "nodes",
    # shard inside each (mesh [[0, 1], [2, 3]]: ranks 0 and 1 are node 0).
    out = str(tmp_path / "run")
    recipe = write_recipe(tmp_path / "r.toml", tiny_config(out, micro=1, parallel="hsdp", replicate_size=2))
    endpoint = f"127.0.0.1:{free_port()}"
    env = {"DITTY_RUN_ID": f"test-{os.getpid()}"}
    started = time.monotonic()
    nodes = [
        ditty(
            "run",
            recipe,
            "--nproc-per-node",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--rdzv-endpoint",
            endpoint,
            env=env,
            wait=False,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=400) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    print(f"2 nodes x 2 ranks, hsdp: {time.monotonic() - started:.0f} s")
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err[-3000:]
    loss_err, weight_err = (
        loss_error(losses(out), losses(single)),
        relative_error(final_weights(out), final_weights(single)),
    )
    print(f"2 nodes hsdp: max relative loss error {loss_err:.2e}, final weights {weight_err:.2e}")
    assert loss_err < TOLERANCE and weight_err < TOLERANCE


# ------------------------------------------------------------------ FSDP with adapters and 8-bit AdamW


def _lora(config: TrainerConfig) -> TrainerConfig:
    from ditty.config.sections import PeftConfig

    return replace(config, peft=PeftConfig(kind="lora", r=4, alpha=8.0, target_modules=["q_proj", "v_proj"]))


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_fsdp_with_lora_trains_and_saves_the_adapter_like_one_process(tmp_path):
    from ditty.train import Trainer

    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    Trainer(_lora(tiny_config(one, micro=4, steps=4))).train()
    started = time.monotonic()
    run_ranks(_train_all, 2, [_lora(tiny_config(two, micro=2, parallel="fsdp", steps=4))], timeout=240)
    print(f"fsdp + lora on 2 ranks: {time.monotonic() - started:.0f} s")
    from safetensors.torch import load_file

    adapters = [load_file(os.path.join(run, "final", "adapter_model.safetensors")) for run in (two, one)]
    loss_err, weight_err = loss_error(losses(two), losses(one)), relative_error(*adapters)
    print(f"fsdp + lora: max relative loss error {loss_err:.2e}, adapter weights {weight_err:.2e}")
    assert adapters[0] and all("lora_" in k for k in adapters[0])
    assert loss_err < TOLERANCE and weight_err < TOLERANCE


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_fsdp_with_torchao_adamw8bit_trains(tmp_path):
    pytest.importorskip("torchao")
    # torchao's 8-bit AdamW compiles its step per parameter shape on first use (about 40 s here).
    run = str(tmp_path / "run")
    config = tiny_config(run, micro=2, parallel="fsdp", steps=3)
    config = replace(config, optimizer=replace(config.optimizer, kind="adamw8bit", backend="torchao"))
    started = time.monotonic()
    run_ranks(_train_all, 2, [config], timeout=400)
    print(f"fsdp + torchao adamw8bit on 2 ranks: {time.monotonic() - started:.0f} s")
    values = losses(run)
    assert len(values) == 3 and all(v == v for v in values) and values[-1] < values[0]
    assert os.path.exists(os.path.join(run, "final", "model.safetensors"))


# ------------------------------------------------------------------ low-memory build of a pretrained model


def _pretrained(config: TrainerConfig, model_dir: str) -> TrainerConfig:
    return replace(config, model=ModelConfig(path=model_dir, init="pretrained"))


def _train_meta(rank: int, world: int, config) -> tuple:
    from ditty.train import Trainer

    trainer = Trainer(config)
    built_on_meta = trainer.built_on_meta
    trainer.train()
    return built_on_meta


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_fsdp_builds_a_pretrained_model_on_meta_and_loads_shards_like_one_process(single, tmp_path):
    # The reference run's final/ is the pretrained model: every rank builds it on the meta device,
    # rank 0 reads the safetensors tensor by tensor and each rank keeps its shard.
    from ditty.train import Trainer

    model_dir = os.path.join(single, "final")
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    Trainer(_pretrained(tiny_config(one, micro=4, steps=3), model_dir)).train()
    started = time.monotonic()
    flags = run_ranks(
        _train_meta, 2, _pretrained(tiny_config(two, micro=2, parallel="fsdp", steps=3), model_dir), timeout=240
    )
    print(f"fsdp from pretrained (meta build) on 2 ranks: {time.monotonic() - started:.0f} s")
    assert flags == [True, True]
    loss_err, weight_err = loss_error(losses(two), losses(one)), relative_error(final_weights(two), final_weights(one))
    print(f"fsdp meta build: max relative loss error {loss_err:.2e}, final weights {weight_err:.2e}")
    assert loss_err < TOLERANCE and weight_err < TOLERANCE


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_fsdp_with_activation_checkpointing_matches_one_process(single, tmp_path):
    # Checkpoint-wrapped blocks (wrapped before sharding) recompute the same values in backward.
    run = str(tmp_path / "ac")
    config = tiny_config(run, micro=2, parallel="fsdp")
    run_ranks(
        _train_all, 2, [replace(config, train=replace(config.train, activation_checkpointing="full"))], timeout=240
    )
    loss_err, weight_err = (
        loss_error(losses(run), losses(single)),
        relative_error(final_weights(run), final_weights(single)),
    )
    print(f"fsdp + activation checkpointing: max relative loss error {loss_err:.2e}, final weights {weight_err:.2e}")
    assert loss_err < TOLERANCE and weight_err < TOLERANCE


# ------------------------------------------------------------------ DDP with activation checkpointing and torch.compile


def _train_and_inspect(rank: int, world: int, configs: list) -> list:
    """Train each config in turn; report what is really in the model (wrappers, compiled blocks, graphs)."""
    from torch._dynamo.utils import counters

    from ditty.parallel.speed import checkpointed_modules, compiled_modules
    from ditty.train import Trainer

    found = []
    for config in configs:
        torch._dynamo.reset()
        counters.clear()
        trainer = Trainer(config)
        trainer.train()
        found.append(
            dict(
                wrapper=type(trainer.model).__name__,
                checkpointed=[type(m._checkpoint_wrapped_module).__name__ for m in checkpointed_modules(trainer.model)],
                compiled=[type(m).__name__ for m in compiled_modules(trainer.model)],
                graphs=counters["stats"]["unique_graphs"],
            )
        )
    return found


@pytest.mark.slow
@pytest.mark.xdist_group("parallel")
def test_ddp_with_activation_checkpointing_and_compile_matches_plain_ddp(tmp_path):
    # One spawn, three runs on 2 gloo ranks: plain DDP (the reference), DDP + selective activation
    # checkpointing, DDP + full activation checkpointing + torch.compile of each block.
    runs = {name: str(tmp_path / name) for name in ("plain", "ac", "compile")}
    configs = [tiny_config(runs["plain"], micro=2, parallel="ddp", steps=4)]
    ac = tiny_config(runs["ac"], micro=2, parallel="ddp", steps=4)
    configs.append(replace(ac, train=replace(ac.train, activation_checkpointing="selective")))
    compiled = tiny_config(runs["compile"], micro=2, parallel="ddp", steps=4)
    configs.append(
        replace(
            compiled,
            train=replace(compiled.train, activation_checkpointing="full", compile=True, compile_scope="blocks"),
        )
    )
    started = time.monotonic()
    found = run_ranks(_train_and_inspect, 2, configs, timeout=600, collective_timeout=300)  # ranks compile unevenly
    print(f"ddp plain + ac + compile on 2 ranks: {time.monotonic() - started:.0f} s")
    for rank_found in found:  # every rank really runs the rewritten model, inside DDP
        plain, ac_run, compile_run = rank_found
        assert {r["wrapper"] for r in rank_found} == {"DistributedDataParallel"}
        assert plain["checkpointed"] == [] and plain["compiled"] == []
        assert ac_run["checkpointed"] == ["LlamaDecoderLayer"] * 2 and ac_run["compiled"] == []
        assert compile_run["checkpointed"] == ["LlamaDecoderLayer"] * 2
        assert compile_run["compiled"] == ["CheckpointWrapper"] * 2 and compile_run["graphs"] > 0
    reference = losses(runs["plain"])
    assert len(reference) == 4
    ac_err, compile_err = loss_error(losses(runs["ac"]), reference), loss_error(losses(runs["compile"]), reference)
    print(f"ddp: max relative loss error, selective AC {ac_err:.2e}, compile + full AC {compile_err:.2e}")
    assert ac_err < TOLERANCE and compile_err < 1e-4
    weight_err = relative_error(final_weights(runs["compile"]), final_weights(runs["plain"]))
    print(f"ddp + compile + AC: final weights relative error {weight_err:.2e}")
    assert weight_err < 1e-4
