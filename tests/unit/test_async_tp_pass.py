"""Async TP on CPU: inductor's micro-pipeline pass, run on our TP block's compiled graph, fuses
TP's collectives with the matmuls once ``enable_async_tp`` has registered the TP group. Fake
2-rank process group; the CPU build has no NCCL, whose presence the pass checks first, so that
check is patched. The fused symmetric-memory ops have no CPU kernel: the graphs are inspected,
not run to the end."""

from collections import Counter

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.distributed as dist
import torch.distributed._symmetric_memory as symmetric_memory
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchtitan.models.llama3 import model as llama
from torchtitan.models.llama3.args import get_model_args
from torchtitan.parallel.llama import llama_block_plan
from torchtitan.parallel.tensor_parallel import enable_async_tp

FUSED = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter")


@pytest.fixture
def tp2_mesh(monkeypatch):
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    try:
        yield init_device_mesh("cpu", (2,))
    finally:
        torch._dynamo.reset()  # no compiled entry guarded on the destroyed group
        dist.destroy_process_group()


def fused_ops_in_forward(mesh, local_batch: int) -> Counter:
    """Fused collective-matmul ops in the compiled forward of one TP block (seq 64), and
    ``graphs``: how many graphs the post-grad passes saw (1: the forward, nothing cached)."""
    args = get_model_args("debugmodel", max_seq_len=64)
    block = llama.TransformerBlock(0, args)
    parallelize_module(block, mesh, llama_block_plan())
    rope = llama.precompute_rope_cache(args.head_dim, 64)
    x = torch.randn(local_batch, 32, args.dim, requires_grad=True)
    found = Counter()

    def count(graph: torch.fx.Graph) -> None:  # runs after the micro-pipeline pass
        found["graphs"] += 1
        for node in graph.nodes:
            found.update(op for op in FUSED if op in str(node.target))

    torch._dynamo.reset()
    with inductor_config.patch(post_grad_custom_post_pass=count, fx_graph_cache=False):
        try:
            torch.compile(block, fullgraph=True)(x, rope)
        except NotImplementedError as e:  # a fused op ran: it has no CPU kernel
            if "symm_mem::fused_" not in str(e):
                raise
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


@pytest.mark.parametrize("local_batch, all_gathers", [(2, 2), (1, 0)])
def test_the_pass_fuses_our_tp_blocks_collectives(tp2_mesh, local_batch, all_gathers):
    """Forward of a block: two sequence all-gathers (before attention and the MLP) and two
    reduce-scatters (after wo and w2). At local batch 1 the all-gathers are not fused: the
    gathered activation reaches the matmuls through two reshapes, a pattern the pass does not
    follow (torch 2.13; docs/performance.md, finding 8)."""
    enable_async_tp(tp2_mesh)
    found = fused_ops_in_forward(tp2_mesh, local_batch)
    expected = {"graphs": 1, "fused_all_gather_matmul": all_gathers}
    expected["fused_matmul_reduce_scatter"] = 2
    assert found == Counter(expected)


def test_the_pass_fuses_nothing_without_the_registration(tp2_mesh, monkeypatch):
    """What async TP did before ``enable_async_tp`` registered the group. (The registry is
    emptied for the test: a group name, once registered, stays so for the process.)"""
    monkeypatch.setattr(symmetric_memory, "_group_name_to_store", {})
    monkeypatch.setattr(inductor_config, "_micro_pipeline_tp", True)
    assert fused_ops_in_forward(tp2_mesh, local_batch=2) == Counter({"graphs": 1})
