"""Muon's Newton-Schulz in the dtype that is fast on the device (ditty.optim.newton_schulz).

The float32 path must give torch.optim.Muon's update to bfloat16's precision; the bfloat16 path is
torch's own step, bit for bit; "auto" takes float32 on a CPU without bfloat16 matrix units.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from ditty.cli import main
from ditty.config.sections import OptimizerConfig
from ditty.optim import build_optimizer
from ditty.optim.newton_schulz import Muon, ns_dtype, orthogonalize
from tests.optim.test_kinds import tiny_llama

MATRIX = "model.layers.1.mlp.down_proj.weight"  # 32 x 64: the wide case (gate/up are tall: 64 x 32)
TALL = "model.layers.0.mlp.up_proj.weight"


def _cpu_flags() -> set[str]:
    path = Path("/proc/cpuinfo")
    if not path.exists():
        return set()
    for line in path.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _three_steps(ns: torch.dtype) -> tuple[dict, dict]:
    """The same gradients through ditty's Muon (products in `ns`) and torch.optim.Muon: weights after."""
    model = tiny_llama()
    reference = copy.deepcopy(model)
    names = [MATRIX, TALL]
    options = dict(lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=True, ns_steps=5, adjust_lr_fn="original")
    ours = Muon([dict(model.named_parameters())[n] for n in names], ns_dtype=ns, **options)
    theirs = torch.optim.Muon([dict(reference.named_parameters())[n] for n in names], **options)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        ids = torch.randint(0, 64, (2, 8), generator=generator)
        model(input_ids=ids, labels=ids).loss.backward()
        for name, parameter in reference.named_parameters():
            parameter.grad = dict(model.named_parameters())[name].grad.clone()
        ours.step()
        theirs.step()
        model.zero_grad()
    return dict(model.named_parameters()), dict(reference.named_parameters())


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_float32_update_matches_torch_muon_to_bfloat16_precision():
    """Three steps on a tiny Llama's gradients (rank <= 16: a batch of 16 tokens). The float32 update
    is the exact (float64) iteration's to 1e-4; torch's bfloat16 one is 8% off it, as bfloat16's
    rounding in the gradient's null space is amplified by the iteration's steep slope at zero; ours
    differs from torch's by no more than torch's own error."""
    initial = dict(tiny_llama().named_parameters())
    ours, theirs = _three_steps(torch.float32)
    exact, _ = _three_steps(torch.float64)
    for name in (MATRIX, TALL):
        ours_update, torch_update = ours[name] - initial[name], theirs[name] - initial[name]
        exact_update = exact[name] - initial[name]
        assert torch_update.abs().max() > 1e-2  # three steps of lr 0.05 moved the matrix
        torch_error = _relative(torch_update, exact_update)
        assert _relative(ours_update, exact_update) < 1e-4
        assert 1e-3 < torch_error < 0.15  # bfloat16's own error: the products really differ
        assert _relative(ours_update, torch_update) <= 1.05 * torch_error


def test_float32_iteration_matches_torch_on_a_full_rank_matrix():
    """One iteration's result against torch's on full-rank matrices (tall and wide): bfloat16 keeps 8
    bits of mantissa (0.4%), five iterations compound it to about 2%."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    coefficients = (3.4445, -4.7750, 2.0315)
    generator = torch.Generator().manual_seed(0)
    for shape in ((128, 64), (64, 128)):
        matrix = torch.randn(*shape, generator=generator)
        ours = orthogonalize(matrix, coefficients, 5, 1e-7, torch.float32)
        theirs = _zeropower_via_newtonschulz(matrix, coefficients, 5, 1e-7).float()
        assert ours.dtype == torch.float32 and _relative(ours, theirs) < 0.03


def test_bfloat16_is_torch_muons_own_step():
    live, reference = _three_steps(torch.bfloat16)
    for name in (MATRIX, TALL):
        assert torch.equal(live[name], reference[name])


def test_orthogonalize_in_float32_gives_singular_values_near_one():
    """Muon's quintic iteration leaves singular values in roughly (0.5, 1.5), for a tall and a wide matrix."""
    generator = torch.Generator().manual_seed(0)
    for shape in ((48, 16), (16, 48)):
        out = orthogonalize(torch.randn(*shape, generator=generator), (3.4445, -4.7750, 2.0315), 5, 1e-7, torch.float32)
        assert out.shape == shape and out.dtype == torch.float32
        singular = torch.linalg.svdvals(out)
        assert singular.min() > 0.5 and singular.max() < 1.5


def test_auto_takes_float32_on_a_cpu_without_bfloat16_units_and_bfloat16_on_cuda():
    assert ns_dtype(torch.device("cuda"), "auto") == torch.bfloat16  # torch's choice, no probe
    assert ns_dtype(torch.device("cpu"), "bfloat16") == torch.bfloat16
    assert ns_dtype(torch.device("cpu"), "float32") == torch.float32
    flags = _cpu_flags()
    if not flags or flags & {"avx512_bf16", "amx_bf16"}:
        pytest.skip("this CPU has bfloat16 units (or no /proc/cpuinfo): either dtype may win the probe")
    assert ns_dtype(torch.device("cpu"), "auto") == torch.float32


def test_build_optimizer_passes_the_recipe_dtype_to_muon():
    model = tiny_llama()
    for choice, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        optimizer = build_optimizer(OptimizerConfig(kind="muon", ns_dtype=choice), model)
        assert optimizer._parts["muon"].ns_dtype == dtype


def test_a_bad_ns_dtype_is_a_recipe_error_and_an_unused_one_a_warning(capsys):
    assert main(["check", "tiny_sft", "--optimizer.kind", "muon", "--optimizer.ns_dtype", "float16"]) == 2
    err = capsys.readouterr().err
    assert "optimizer.ns_dtype" in err and "bfloat16" in err
    assert main(["check", "tiny_sft", "--optimizer.ns_dtype", "float32"]) == 0
    out = capsys.readouterr()
    assert "optimizer.ns_dtype" in out.out + out.err


def _vote(rank: int, world_size: int) -> str:
    from ditty.optim.newton_schulz import _agreed

    return str(_agreed(torch.bfloat16 if rank == 0 else torch.float32))


@pytest.mark.slow  # two gloo ranks
def test_ddp_ranks_agree_on_one_dtype():
    """Replicas must apply the same update: bfloat16 only where every rank measured it faster."""
    from tests.parallel.harness import run_ranks

    assert run_ranks(_vote, 2) == ["torch.float32", "torch.float32"]
