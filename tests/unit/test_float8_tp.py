"""Float8 linears that scale their TP shards on their own (torchtitan/float8/tp.py), on
a one-rank gloo mesh: the plain TP plan runs with them, gives the loss and gradients of the model
without TP (one shard is the whole tensor, so the scales are the same), and casts without the
amax reduction of a TP-sharded tensor (on more ranks, each such reduction is an all-reduce; a
one-rank mesh skips the collective, so the test counts the reductions). Across ranks:
tests/distributed/test_float8.py."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.utils._python_dispatch import TorchDispatchMode

from tests.unit.test_float8_backward import llama_float8
from torchtitan.config import Float8
from torchtitan.float8.shard_scaled import local_layout
from torchtitan.float8.tp import scale_float8_by_shard, scales_tp_shards
from torchtitan.models.llama3 import Transformer, get_model_args
from torchtitan.models.llama3.parallelize import block_tp_plan, root_tp_plan
from torchtitan.parallel.tensor_parallel import apply_tp

EMULATED = dict(enable=True, emulate=True)
LINEARS = 7 * 6  # debug model: 7 per block, 6 blocks


@pytest.fixture
def tp_mesh(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def float8_model(mesh=None, shard_scales=False) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(get_model_args("debugmodel", max_seq_len=32))
    model.init_weights()
    llama_float8(model, Float8(**EMULATED))
    if mesh is not None:
        apply_tp(model, mesh, root_tp_plan(False), block_tp_plan())
    if shard_scales:
        assert scale_float8_by_shard(model) == LINEARS
    return model


def train_step(model, tokens):
    loss = model(tokens).float().square().mean()
    loss.backward()
    return loss


class ShardedAmaxCounter(TorchDispatchMode):
    """Counts max-reductions of DTensors sharded over the mesh: what torchao's tensorwise amax
    of a sharded tensor is, and what DTensor all-reduces across ranks."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.max.default, torch.ops.aten.amax.default):
            x = args[0]
            if isinstance(x, DTensor) and any(p.is_shard() for p in x.placements):
                self.count += 1
        return func(*args, **(kwargs or {}))


def test_shard_scaled_linears_match_the_model_without_tp_and_reduce_no_amax(tp_mesh):
    tokens = torch.randint(256, (2, 32))
    reference = float8_model()
    want = train_step(reference, tokens)
    runs = {}
    for shard_scales in (False, True):
        model = float8_model(tp_mesh, shard_scales)
        with ShardedAmaxCounter() as counter:
            loss = train_step(model, tokens)
        runs[shard_scales] = counter.count
        assert loss.item() == pytest.approx(want.item(), rel=1e-6)
        for name in ("attention.wq", "attention.wo", "feed_forward.w2"):
            grad = model.layers["0"].get_submodule(name).weight.grad
            torch.testing.assert_close(
                grad.full_tensor(), reference.layers["0"].get_submodule(name).weight.grad
            )
    assert runs[False] > 0, "torchao's casts of sharded tensors reduce their amax"
    assert runs[True] == 0, runs


def test_layouts_of_column_and_row_parallel_linears(tp_mesh):
    def dt(shape, placement):
        return distribute_tensor(torch.ones(shape), tp_mesh, [placement])

    column = dt((8, 4), Shard(0))
    row = dt((4, 8), Shard(1))
    assert local_layout(dt((2, 3, 4), Replicate()), column) == (Partial(), Shard(2))
    assert local_layout(dt((2, 3, 8), Shard(2)), row) == (Shard(2), Partial())
    assert local_layout(dt((2, 3, 8), Shard(1)), row) is None  # not a TP linear's layout
    assert local_layout(dt((2, 3, 4), Replicate()), dt((8, 4), Replicate())) is None


def test_shard_scales_are_for_the_tensorwise_recipe():
    assert scales_tp_shards(Float8(enable=True))
    assert not scales_tp_shards(Float8(enable=True, recipe="rowwise"))
    assert not scales_tp_shards(Float8(enable=True, recipe="rowwise_with_gw_hp"))
    assert not scales_tp_shards(Float8())
