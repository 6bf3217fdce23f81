"""Async TP on CPU: inductor's micro-pipeline pass, run on our TP block's compiled graph, fuses
TP's collectives with the matmuls once ``enable_async_tp`` has registered the TP group. Fake
2-rank process group; the CPU build has no NCCL, whose presence the pass checks first, so that
check is patched. The fused symmetric-memory ops have no CPU kernel: the pass runs on copies of
the compiled graphs, which are inspected; whether the fused block computes the same values is
checked on GPU (tests/gpu/test_async_tp.py)."""

from collections import Counter

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.distributed as dist
import torch.distributed._symmetric_memory as symmetric_memory
from torch._inductor.fx_passes.micro_pipeline_tp import micro_pipeline_tp_pass
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchtitan.models.llama3 import model as llama
from torchtitan.models.llama3.args import get_model_args
from torchtitan.models.llama3.parallelize import block_tp_plan
from torchtitan.parallel.tensor_parallel import enable_async_tp

FUSED = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter")
OPS = (*FUSED, "all_gather_into_tensor", "reduce_scatter_tensor")


@pytest.fixture
def tp2_mesh(monkeypatch):
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    try:
        yield init_device_mesh("cpu", (2,))
    finally:
        torch._dynamo.reset()  # no compiled entry guarded on the destroyed group
        dist.destroy_process_group()


def fused_ops(mesh, local_batch: int) -> Counter:
    """Collectives left and fused ops in the compiled forward and backward of one TP block
    (seq 64), keyed ``"forward <op>"`` / ``"backward <op>"``, and ``graphs``: how many graphs the
    post-grad passes saw (2: nothing cached). The fused ops have no CPU kernel, so the pass runs
    on a copy of each graph and the block itself runs unfused, through its backward."""
    args = get_model_args("debugmodel", max_seq_len=64)
    block = llama.TransformerBlock(0, args)
    parallelize_module(block, mesh, block_tp_plan())
    rope = llama.precompute_rope_cache(args.head_dim, 64)
    x = torch.randn(local_batch, 32, args.dim, requires_grad=True)
    found = Counter()

    def count(graph: torch.fx.Graph) -> None:  # after inductor's post-grad passes
        found["graphs"] += 1
        part = "backward" if any(n.name.startswith("tangents") for n in graph.nodes) else "forward"
        copy = torch.fx.Graph()
        copy.output(copy.graph_copy(graph, {}))
        micro_pipeline_tp_pass(copy)
        for node in copy.nodes:
            found.update(f"{part} {op}" for op in OPS if op in str(node.target))

    torch._dynamo.reset()
    patch = dict(post_grad_custom_post_pass=count, fx_graph_cache=False, _micro_pipeline_tp=False)
    with inductor_config.patch(**patch):
        torch.compile(block, fullgraph=True)(x, rope).sum().backward()
    return found


def test_async_tp_registers_the_tp_group_and_turns_on_the_pass(tp2_mesh, monkeypatch):
    registered = []
    real = symmetric_memory.enable_symm_mem_for_group
    monkeypatch.setattr(
        symmetric_memory,
        "enable_symm_mem_for_group",
        lambda name: registered.append(name) or real(name),
    )
    enable_async_tp(tp2_mesh)
    assert registered == [tp2_mesh.get_group().group_name]
    assert symmetric_memory.is_symm_mem_enabled_for_group(registered[0])
    assert inductor_config._micro_pipeline_tp


@pytest.mark.parametrize("local_batch", [1, 2])
def test_the_pass_fuses_our_tp_blocks_collectives(tp2_mesh, local_batch):
    """Forward of a block: two sequence all-gathers (before attention and the MLP) and two
    reduce-scatters (after wo and w2). Backward: two all-gathers of output gradients and two
    reduce-scatters of input gradients; the latter stay, as each reduces a sum of matmuls
    (q/k/v, w1/w3), which the pass cannot split. At local batch 1 the all-gathers stay too: the
    gathered activation reaches the matmuls through two reshapes, and the pass follows one
    (torch 2.13). A pre-pass that fused them (commit 79be4d2) made a 1B TP block slower and 8B
    training no faster on GPU, so it was dropped (docs/performance.md)."""
    enable_async_tp(tp2_mesh)
    gathers = "fused_all_gather_matmul" if local_batch > 1 else "all_gather_into_tensor"
    assert fused_ops(tp2_mesh, local_batch) == Counter(
        {
            "graphs": 2,
            f"forward {gathers}": 2,
            "forward fused_matmul_reduce_scatter": 2,
            f"backward {gathers}": 2,
            "backward reduce_scatter_tensor": 2,
        }
    )


def test_the_pass_fuses_nothing_without_the_registration(tp2_mesh, monkeypatch):
    """What async TP did before ``enable_async_tp`` registered the group. (The registry is
    emptied for the test: a group name, once registered, stays so for the process.)"""
    monkeypatch.setattr(symmetric_memory, "_group_name_to_store", {})
    found = fused_ops(tp2_mesh, local_batch=2)
    assert not any("fused" in key for key in found), found
    assert found["forward all_gather_into_tensor"] == 2
