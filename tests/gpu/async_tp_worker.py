"""One Llama block under TP on 2 GPUs, compiled with and without async TP; prints which fused
collective-matmul ops inductor emitted and the block's time. Run by tests/gpu/test_async_tp.py
as ``async_tp_worker.py SEQ LOCAL_BATCH``. Variants: plain, async TP, async TP with the
collectives reordered as the trainer does by default (the pass then skips collectives it judges
already hidden), and plain again last (the first variant's time includes warm-up effects).
``diff``: the largest difference of the block's output and input gradient from the plain
variant's, relative to the largest value. Counts are of fused-op calls in the forward's code and
in all code. Inductor's caches are off: a cached graph skips the post-grad passes, so a variant
could reuse another's."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch._inductor.config as inductor_config
import torch.distributed as dist
from torch._inductor.utils import run_and_get_code
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

from torchtitan.models.llama3 import model as llama
from torchtitan.models.llama3.args import MODEL_FLAVORS
from torchtitan.models.llama3.parallelize import block_tp_plan
from torchtitan.parallel.compile import reorder_collectives_for_overlap
from torchtitan.parallel.tensor_parallel import enable_async_tp

FUSED = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter")


def block_and_input(mesh, seq: int, batch: int):
    """A TP block and its input as training has it: this rank's sequence shard, a plain tensor
    (the embedding's RowwiseParallel hands out local tensors)."""
    args = MODEL_FLAVORS["1B"]
    torch.manual_seed(0)
    block = llama.TransformerBlock(0, args).to(device="cuda", dtype=torch.bfloat16)
    parallelize_module(block, mesh, block_tp_plan())
    rope = llama.precompute_rope_cache(args.head_dim, seq).cuda()
    local = seq // mesh.size()
    x = torch.randn(batch, local, args.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return block, x, rope


def step(block, x, rope):
    block(x, rope).float().sum().backward()


def output_and_input_grad(block, x, rope) -> tuple[torch.Tensor, torch.Tensor]:
    x.grad = None
    y = block(x, rope)
    y.float().sum().backward()
    return y.detach().float(), x.grad.float()


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def timed(fn, *args, iters: int = 10) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e3


def main() -> int:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    seq = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    torch.compiler.config.force_disable_caches = True
    variants = (
        ("sync", False, False),
        ("async", True, False),
        ("async_reorder", True, True),
        ("sync_last", False, False),  # plain again: how much of a time difference is order
    )
    plain = None
    for name, async_tp, reorder in variants:
        torch._dynamo.reset()
        if async_tp:
            enable_async_tp(mesh)
        if reorder:
            reorder_collectives_for_overlap()
        if name == "sync_last":
            inductor_config._micro_pipeline_tp = False
            inductor_config.reorder_for_compute_comm_overlap = False
        block, x, rope = block_and_input(mesh, seq, batch)
        compiled = torch.compile(block, fullgraph=True)
        try:
            _, code = run_and_get_code(step, compiled, x, rope)
        except Exception as e:  # report and go on: which variant fails is the finding
            if rank == 0:
                print(f"ASYNC_TP_RESULT {name}: failed: {str(e).splitlines()[0][:300]}", flush=True)
            continue
        calls = {op: f"torch.ops.symm_mem.{op}.default(" for op in FUSED}
        forward = {op: code[0].count(call) for op, call in calls.items()}
        total = {op: sum(c.count(call) for c in code) for op, call in calls.items()}
        ms = timed(step, compiled, x, rope)
        y, dx = output_and_input_grad(compiled, x, rope)
        plain = plain or (y, dx)
        diff = max(relative_difference(y, plain[0]), relative_difference(dx, plain[1]))
        if rank == 0:
            print(
                f"ASYNC_TP_RESULT {name}: forward {forward} all {total} {ms:.2f} ms per fwd+bwd "
                f"diff {diff:.2e}",
                flush=True,
            )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
