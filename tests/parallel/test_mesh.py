"""mesh_shape: the pure function the recipe compiler calls (no torch), and its problems."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ditty.config.sections import ParallelConfig
from ditty.parallel.mesh import MeshShape, mesh_shape


def shape(world, **kw):
    result = mesh_shape(ParallelConfig(**kw), world)
    assert isinstance(result, MeshShape), result
    return result


def problems(world, **kw):
    result = mesh_shape(ParallelConfig(**kw), world)
    assert isinstance(result, list), result
    return [(p.key, p.message) for p in result]


@pytest.mark.parametrize("kind", ["ddp", "fsdp", "deepspeed"])
def test_one_dimensional_kinds(kind):
    s = shape(4, kind=kind)
    assert (s.dim_names, s.sizes, s.world_size, s.data_parallel_size) == (("dp",), (4,), 4, 4)


def test_hsdp_derives_the_shard_size():
    s = shape(8, kind="hsdp", replicate_size=2)
    assert (s.dim_names, s.sizes, s.shard_size, s.data_parallel_size) == (("replicate", "shard"), (2, 4), 4, 8)
    assert shape(4, kind="hsdp", replicate_size=2, shard_size=2).sizes == (2, 2)


def test_per_rank_share_in_the_plan():
    assert shape(4, kind="fsdp").describe() == (
        "fsdp mesh (dp 4): each rank holds 1/4 of parameters, gradients and optimizer state"
    )
    assert shape(4, kind="hsdp", replicate_size=2).describe() == (
        "hsdp mesh (replicate 2 x shard 2): each rank holds 1/2 of parameters, gradients and optimizer state"
    )
    assert "whole model" in shape(2, kind="ddp").describe()
    assert (
        shape(2, kind="deepspeed", zero_stage=2)
        .describe()
        .endswith("whole parameters; 1/2 of gradients and optimizer state per rank")
    )
    assert shape(2, kind="deepspeed", zero_stage=3).shard_size == 2
    assert shape(1, kind="none").describe().startswith("1 process")


def test_hsdp_product_must_equal_the_world_size():
    assert problems(4, kind="hsdp", replicate_size=2, shard_size=4) == [
        ("parallel.shard_size", "replicate_size x shard_size = 2 x 4 = 8, but the world size is 4")
    ]
    assert problems(4, kind="hsdp", replicate_size=3) == [
        ("parallel.replicate_size", "= 3 does not divide the world size 4")
    ]
    assert [k for k, _ in problems(4, kind="hsdp", replicate_size=0, shard_size=0)] == [
        "parallel.replicate_size",
        "parallel.shard_size",
    ]


def test_kind_none_on_several_processes_is_an_error():
    assert problems(2, kind="none")[0][0] == "parallel.kind"
    assert shape(1, kind="none").world_size == 1


def test_reshard_group_size_must_divide_the_shard_size():
    assert shape(4, kind="fsdp", reshard_after_forward=2).sizes == (4,)
    assert problems(4, kind="fsdp", reshard_after_forward=3)[0][0] == "parallel.reshard_after_forward"
    assert shape(4, kind="fsdp", reshard_after_forward=False).sizes == (4,)  # a bool is not a group size


def test_mesh_shape_imports_no_torch():
    code = (
        "import sys; from ditty.parallel.mesh import mesh_shape; from ditty.parallel.deepspeed import "
        "deepspeed_problems; import ditty.parallel; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ tensor and context parallel


def test_tp_and_cp_make_one_named_mesh_with_tensor_parallel_innermost():
    s = shape(8, kind="fsdp", tp=2, cp=2)
    assert (s.dim_names, s.sizes) == (("dp", "cp", "tp"), (2, 2, 2))
    assert (s.tp, s.cp, s.data_parallel_size, s.batch_ranks, s.shard_size) == (2, 2, 2, 4, 4)
    # DeviceMesh's row-major layout: rank = (dp * cp + cp_index) * tp + tp_index
    assert s.coordinates(5) == {"dp": 1, "cp": 0, "tp": 1}
    assert s.coordinates(6) == {"dp": 1, "cp": 1, "tp": 0}
    assert shape(4, kind="fsdp", tp=4).sizes == (1, 1, 4)  # "1 x 4": no data parallel left


def test_the_plan_says_the_mesh_and_each_rank_share():
    text = shape(4, kind="fsdp", tp=2).describe()
    assert text.startswith("fsdp mesh (dp 2 x tp 2): each rank holds 1/4 of parameters, gradients and optimizer state")
    assert "tensor parallel over 2 ranks" in text and "the batch splits over 2 data-parallel rank(s)" in text
    assert "context parallel over 2 ranks" in shape(4, kind="fsdp", cp=2).describe()


def test_tp_and_cp_must_divide_the_world_and_take_fsdp():
    assert problems(6, kind="fsdp", tp=4) == [("parallel.tp", "tp x cp = 4 x 1 = 4 does not divide the world size 6")]
    assert problems(4, kind="fsdp", cp=0)[0][0] == "parallel.cp"
    for kind in ("none", "ddp", "hsdp", "deepspeed"):
        found = mesh_shape(ParallelConfig(kind=kind, tp=2, replicate_size=2), 4)
        assert isinstance(found, list) and found[0].rule == f"scale.kind-{kind}" and 'kind = "fsdp"' in found[0].fix
    assert problems(4, kind="fsdp", tp=2, reshard_after_forward=2)[0][0] == "parallel.reshard_after_forward"


def test_data_parallel_kinds_keep_their_mesh_names():
    assert shape(4, kind="fsdp", tp=1, cp=1).dim_names == ("dp",)
    assert not shape(4, kind="fsdp").model_parallel
