"""The Trainer on the DeepSpeed engine (ZeRO-2 and ZeRO-3) on two CPU processes, against one process.

Real deepspeed (the dev set-up installs it; `DS_ACCELERATOR=cpu`), real gloo ranks, one spawn for
every scenario. Measured here (fp32, 8 steps, global batch 8, clipping active): the per-step losses
agree with one process within 1e-7 relative and the final weights within 6e-7, for both stages (and
ZeRO-3 with optimizer and parameter offload, or with activation checkpointing), so the tolerance is
ditty's usual parity bound of 1e-5.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch

from tests.parallel.harness import run_ranks
from tests.train.test_distributed import (
    TOLERANCE,
    final_weights,
    loss_error,
    losses,
    relative_error,
    single,  # noqa: F401 (a fixture)
    tiny_config,
)

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]


def with_lora(config):
    from ditty.config.sections import PeftConfig

    return replace(config, peft=PeftConfig(kind="lora", r=8))


def adapter_weights(run_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(run_dir, "final", "adapter_model.safetensors"))


def deepspeed_config(out: str, stage: int, offload: bool = False, **train):
    config = tiny_config(
        out, micro=2, parallel="deepspeed", zero_stage=stage, offload_optimizer=offload, offload_params=offload
    )
    return replace(config, train=replace(config.train, **train)) if train else config


def _run_all(rank: int, world: int, configs: list) -> None:
    os.environ["DS_ACCELERATOR"] = "cpu"
    from ditty.train import Trainer

    for config in configs:
        Trainer(config).train()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("deepspeed")
    paths = {
        name: str(base / name) for name in ("zero2", "zero3", "zero3_offload", "zero3_ac", "zero3_lora", "resumed")
    }
    first_half = deepspeed_config(paths["resumed"], 2, steps=4)
    first_half = replace(first_half, checkpoint=replace(first_half.checkpoint, every=2))
    run_ranks(
        _run_all,
        2,
        [
            deepspeed_config(paths["zero2"], 2),
            deepspeed_config(paths["zero3"], 3),
            deepspeed_config(paths["zero3_offload"], 3, offload=True),  # the offload code path (CPU to CPU here)
            deepspeed_config(paths["zero3_ac"], 3, activation_checkpointing="full"),
            with_lora(deepspeed_config(paths["zero3_lora"], 3)),  # frozen base partitioned, adapter gathered for final/
            first_half,  # 4 steps, checkpoints at 2 and 4 ...
            replace(  # ... then resumed to 8 (extending a finished run is asked for in so many words)
                first_half,
                train=replace(first_half.train, steps=8),
                checkpoint=replace(first_half.checkpoint, overwrite_finished=True),
            ),
        ],
        timeout=600,
    )
    return paths


@pytest.mark.parametrize("name", ["zero2", "zero3", "zero3_offload", "zero3_ac"])
def test_deepspeed_on_two_ranks_matches_one_process(runs, single, name):
    run = runs[name]
    loss_err, weight_err = (
        loss_error(losses(run), losses(single)),
        relative_error(final_weights(run), final_weights(single)),
    )
    print(f"deepspeed {name}: max relative loss error {loss_err:.2e}, final weights {weight_err:.2e}")
    assert loss_err < TOLERANCE and weight_err < TOLERANCE


def test_zero_partitions_the_optimizer_state(runs, single):
    figures = {}
    for run in (single, runs["zero2"], runs["zero3"]):
        with open(os.path.join(run, "env.json"), encoding="utf-8") as f:
            figures[run] = json.load(f)["memory"]
    one = figures[single]
    zero2, zero3 = figures[runs["zero2"]], figures[runs["zero3"]]
    print(
        "optimizer state per rank: zero2 "
        f"{zero2['optimizer_state_bytes_per_rank'] / one['optimizer_state_bytes_per_rank']:.3f}, "
        f"zero3 {zero3['optimizer_state_bytes_per_rank'] / one['optimizer_state_bytes_per_rank']:.3f} of one process; "
        f"parameters zero3 {zero3['parameter_bytes_per_rank'] / one['parameter_bytes_per_rank']:.3f}"
    )
    for figure in (zero2, zero3):  # partitions of the flat parameters, padded to an even split
        assert figure["optimizer_state_bytes_per_rank"] <= 0.55 * one["optimizer_state_bytes_per_rank"]
    assert zero2["parameter_bytes_per_rank"] == one["parameter_bytes_per_rank"]  # ZeRO-2 keeps whole parameters
    assert zero3["parameter_bytes_per_rank"] <= 0.55 * one["parameter_bytes_per_rank"]


def test_resume_through_deepspeed_checkpoints_continues_exactly(runs):
    resumed, straight = runs["resumed"], runs["zero2"]
    last = os.path.join(resumed, "checkpoints", "step-8")  # written by the resumed half
    engine_files = os.listdir(os.path.join(last, "deepspeed", "state"))
    assert sorted(f for f in engine_files if f.endswith("optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    assert os.path.exists(os.path.join(last, "COMPLETE"))
    assert losses(resumed) == pytest.approx(losses(straight), rel=1e-6)
    a, b = final_weights(resumed), final_weights(straight)
    assert all(torch.equal(a[k], b[k]) for k in b), "the resumed run's weights differ from the uninterrupted run's"


def test_resume_on_another_world_size_is_refused_before_anything_loads(runs):
    from ditty.config.errors import RecipeError
    from ditty.train import Trainer

    config = deepspeed_config(runs["resumed"], 2, steps=10)
    with pytest.raises(RecipeError, match="written by 2 DeepSpeed processes, this run has 1") as caught:
        Trainer(config)
    assert caught.value.problems[0].key == "checkpoint.resume"
    assert "resume with 2 processes" in caught.value.problems[0].fix


def test_export_rebuilds_the_model_from_deepspeed_partitions(runs, tmp_path):
    from ditty.cli.export import export

    out = export(runs["zero3"], tmp_path / "exported")
    from safetensors.torch import load_file

    exported, final = load_file(os.path.join(out, "model.safetensors")), final_weights(runs["zero3"])
    assert sorted(exported) == sorted(final)
    assert all(torch.equal(exported[k], final[k]) for k in final)


def test_lora_under_zero3_matches_lora_on_one_process(runs, tmp_path):
    from ditty.train import Trainer

    one = str(tmp_path / "lora_one")
    Trainer(with_lora(tiny_config(one, micro=4))).train()
    loss_err = loss_error(losses(runs["zero3_lora"]), losses(one))
    a, b = adapter_weights(runs["zero3_lora"]), adapter_weights(one)
    weight_err = relative_error(a, b)
    print(f"deepspeed zero3 + LoRA: max relative loss error {loss_err:.2e}, adapter weights {weight_err:.2e}")
    assert len(a) == len(b) > 0 and loss_err < TOLERANCE and weight_err < TOLERANCE


def test_resume_with_another_parallel_kind_is_refused_before_anything_is_written(runs):
    from ditty.config.errors import RecipeError
    from ditty.train import Trainer

    run = runs["resumed"]
    recipe = open(os.path.join(run, "recipe.toml"), encoding="utf-8").read()
    config = tiny_config(run, micro=4, steps=10)  # parallel.kind = "none" against DeepSpeed's checkpoint
    config = replace(config, checkpoint=replace(config.checkpoint, force_resume=True))
    with pytest.raises(RecipeError, match="written by DeepSpeed") as caught:
        Trainer(config)
    assert caught.value.problems[0].key == "parallel.kind"
    assert open(os.path.join(run, "recipe.toml"), encoding="utf-8").read() == recipe
