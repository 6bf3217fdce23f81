"""ParallelDims: degree resolution, one-line errors, and the mesh it builds (fake process group)."""

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchtitan.config import ConfigError, Parallelism
from torchtitan.parallel.dims import ParallelDims


def dims(world_size, **degrees) -> ParallelDims:
    return ParallelDims.from_config(Parallelism(**degrees), world_size)


def test_shard_degree_minus_one_takes_what_is_left():
    d = dims(16, pipeline_parallel_degree=2, tensor_parallel_degree=2, context_parallel_degree=2)
    assert (d.pp, d.dp_replicate, d.dp_shard, d.cp, d.tp) == (2, 1, 2, 2, 2)
    assert d.dp_degree == 2 and d.fsdp_degree == 4 and d.model_parallel_size == 8


@pytest.mark.parametrize(
    "world, degrees, expected",
    [
        (4, {"tensor_parallel_degree": 3}, "not divisible by the product 3"),
        (4, {"data_parallel_shard_degree": 3}, "multiply to 3 but the world size is 4"),
        (8, {"data_parallel_shard_degree": 2, "tensor_parallel_degree": 2}, "multiply to 4"),
        (4, {"tensor_parallel_degree": 0}, "tensor_parallel_degree must be >= 1"),
        (4, {"data_parallel_shard_degree": 0}, "must be >= 1 or -1"),
    ],
)
def test_invalid_degrees_fail_in_one_line(world, degrees, expected):
    with pytest.raises(ConfigError) as info:
        dims(world, **degrees)
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.fixture
def fake_world():
    def init(rank, world_size):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)

    yield init
    dist.destroy_process_group()


def test_4d_mesh_and_flattened_submeshes(fake_world):
    fake_world(rank=13, world_size=16)
    d = dims(16, pipeline_parallel_degree=2, context_parallel_degree=2, tensor_parallel_degree=2)
    world = d.build_mesh("cpu")
    assert world.mesh_dim_names == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert tuple(world.shape) == (2, 1, 2, 2, 2)
    # rank 13 = pp 1, dp_shard 1, cp 0, tp 1
    assert [world.get_local_rank(n) for n in ("pp", "dp_shard", "cp", "tp")] == [1, 1, 0, 1]
    assert d.fsdp_mesh.size() == 4 and d.fsdp_mesh.ndim == 1
    assert d.loss_mesh.size() == 4
    assert d.dp_rank == 1
    assert d.mesh("tp").size() == 2


def test_hsdp_mesh_is_two_dimensional(fake_world):
    fake_world(rank=5, world_size=8)
    d = dims(8, data_parallel_replicate_degree=2, context_parallel_degree=2)
    d.build_mesh("cpu")
    assert d.fsdp_mesh.ndim == 2 and tuple(d.fsdp_mesh.shape) == (2, 4)
    assert d.dp_degree == 4 and d.dp_rank == 2  # replica 1, shard 0 of 2
