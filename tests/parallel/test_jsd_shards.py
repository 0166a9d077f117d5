"""Distillation's divergence on vocabulary shards (ditty.objectives.jsd_shards, through
`ditty.objectives.jsd.chunked_jsd`) on 1, 2 and 4 real gloo processes against the same call on whole
heads: the student's and the teacher's heads split by rows as tensor parallel splits them (DTensors
`Shard(0)` on a "tp" mesh, 259 tokens in uneven pieces: 130/129 and 65/65/65/64), the hidden states
replicated. Forward KL, reverse KL and the mixture, with the hard-label term, with the teacher's
mistakes corrected from the data, on sampled rows, and with masked positions and a call with no
scored token. The sums and the gradients of the student's hidden states and head agree to 1e-12 in
float64 (only rounding differs); each rank computes the dense reference itself from one seed.
"""

from __future__ import annotations

import pytest
import torch

from tests.parallel.harness import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("parallel")]

VOCAB, WIDTH, ROWS, LENGTH = 259, 12, 3, 9
CASES = {
    "forward-kl": dict(beta=0.0),
    "reverse-kl": dict(beta=1.0, temperature=2.0),
    "mixture-with-cross-entropy": dict(beta=0.5, cross_entropy=True),
    "teacher-mistakes-from-the-data": dict(beta=0.5, cross_entropy=True, follow_teacher_mistakes=False),
    "sampled-rows": dict(beta=0.0, cross_entropy=True, follow_teacher_mistakes=False, data_rows=[True, False, True]),
}


def _compare(rank: int, world_size: int, options: dict, scored: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    from ditty.objectives.jsd import chunked_jsd
    from ditty.stages.fused_loss import Projection

    g = torch.Generator().manual_seed(0)
    student_hidden = torch.randn(ROWS, LENGTH, WIDTH, generator=g, dtype=torch.float64)
    teacher_hidden = torch.randn(ROWS, LENGTH, WIDTH, generator=g, dtype=torch.float64)
    student_weight = torch.randn(VOCAB, WIDTH, generator=g, dtype=torch.float64)
    # the teacher's rows near the student's: it often shares the argmax, not always
    teacher_weight = student_weight + 0.5 * torch.randn(VOCAB, WIDTH, generator=g, dtype=torch.float64)
    labels = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=g)
    labels[:, :3] = -100  # the prompt
    labels[0, 3:6] = torch.tensor([0, VOCAB - 1, 130])  # the first and last rows, and a shard's edge
    if not scored:
        labels[:] = -100
    options = dict(options)
    if "data_rows" in options:
        options["data_rows"] = torch.tensor(options["data_rows"])

    def run(hidden, weight, teacher_head_weight, wrap):
        sums = chunked_jsd(
            wrap(hidden), Projection(weight), wrap(teacher_hidden), Projection(teacher_head_weight), labels,
            chunks=2, **options,
        )  # fmt: skip
        (sums.divergence + 0.3 * sums.cross_entropy).backward()
        return sums

    hidden = student_hidden.clone().requires_grad_()
    weight = student_weight.clone().requires_grad_()
    dense = run(hidden, weight, teacher_weight, lambda t: t)

    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    shard_hidden = student_hidden.clone().requires_grad_()
    shard_weight = distribute_tensor(student_weight.clone(), mesh, [Shard(0)]).requires_grad_()
    teacher_rows = distribute_tensor(teacher_weight.clone(), mesh, [Shard(0)])
    replicated = lambda t: DTensor.from_local(t, mesh, [Replicate()], run_check=False)  # noqa: E731
    sharded = run(shard_hidden, shard_weight, teacher_rows, replicated)
    return {
        "local_rows": shard_weight.to_local().shape[0],
        "sums": [(float(a), float(b)) for a, b in zip(dense, sharded)],
        "hidden_grad": float((_grad(hidden) - _grad(shard_hidden)).abs().max()),
        "head_grad": float((weight.grad - shard_weight.grad.full_tensor()).abs().max()),
        "gradient_size": float(weight.grad.abs().max()),
    }


def _grad(tensor):
    return tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_divergence_on_vocabulary_shards_is_the_whole_ones(world_size, case):
    results = run_ranks(_compare, world_size, CASES[case], True)
    pieces = {1: [259], 2: [130, 129], 4: [65, 65, 65, 64]}[world_size]
    assert sorted(r["local_rows"] for r in results) == sorted(pieces)
    for result in results:
        divergence, cross_entropy, tokens, corrected = result["sums"]
        assert divergence[0] > 0 and divergence[1] == pytest.approx(divergence[0], rel=1e-12)
        assert cross_entropy[1] == pytest.approx(cross_entropy[0], rel=1e-12)
        assert tokens[0] == tokens[1] == ROWS * (LENGTH - 3)  # every label after the prompt
        assert corrected[1] == corrected[0]
        if case.startswith(("teacher", "sampled")):
            assert 0 < corrected[0] < tokens[0]  # some tokens follow the teacher, some the data
        assert result["gradient_size"] > 1e-3
        assert result["hidden_grad"] < 1e-12 and result["head_grad"] < 1e-12, result


def test_a_call_with_no_scored_token_gives_zeros_on_every_rank():
    for result in run_ranks(_compare, 2, CASES["mixture-with-cross-entropy"], False):
        assert result["sums"] == [(0.0, 0.0)] * 4
        assert result["hidden_grad"] == 0.0 and result["head_grad"] == 0.0
