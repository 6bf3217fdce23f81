"""One Llama block under TP on 2 GPUs, compiled with and without async TP; prints which fused
collective-matmul ops inductor emitted and the block's time. Run by tests/gpu/test_async_tp.py."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch._inductor.utils import run_and_get_code
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import parallelize_module

from torchtitan.models.llama3 import model as llama
from torchtitan.models.llama3.args import MODEL_FLAVORS
from torchtitan.parallel.llama import llama_block_plan
from torchtitan.parallel.tensor_parallel import enable_async_tp

FUSED = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter")


def block_and_input(mesh, seq: int):
    args = MODEL_FLAVORS["8B"]
    torch.manual_seed(0)
    block = llama.TransformerBlock(0, args).to(device="cuda", dtype=torch.bfloat16)
    parallelize_module(block, mesh, llama_block_plan())
    rope = llama.precompute_rope_cache(args.head_dim, seq).cuda()
    x = torch.randn(1, seq, args.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x = DTensor.from_local(x.chunk(mesh.size(), dim=1)[mesh.get_local_rank()], mesh, [Shard(1)])
    return block, x, rope


def step(block, x, rope):
    out = block(x, rope)
    out.to_local().float().sum().backward()


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
    results = {}
    for name, async_tp in (("sync", False), ("async", True)):
        torch._dynamo.reset()
        if async_tp:
            enable_async_tp()
        block, x, rope = block_and_input(mesh, seq)
        compiled = torch.compile(block, fullgraph=True)
        _, code = run_and_get_code(step, compiled, x, rope)
        found = {op: sum(c.count(op) for c in code) for op in FUSED}
        ms = timed(step, compiled, x, rope)
        results[name] = (found, ms)
        if rank == 0:
            print(f"ASYNC_TP_RESULT {name}: fused ops {found}, {ms:.2f} ms per fwd+bwd", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
