"""GPU time of FSDP2's all-gather copy-out for one Llama 3 block: the gathered bf16 buffer (rank
by rank, each rank's part holding its shard of every parameter) split into each parameter's
unsharded tensor (``torch.ops.fsdp.split_with_sizes_copy``, i.e. ``torch.split_with_sizes_copy``
along dim 1 of the (world, -1) view; FSDP runs it on the compute stream after each all-gather,
twice a step per block when blocks reshard after forward), against a Triton kernel per
parameter doing the same copy (one program per 1,024 elements of one rank's row).

    python scripts/bench/all_gather_copy_out.py --flavor 8B --world 4
"""

from __future__ import annotations

import argparse
import functools

import torch
import triton
import triton.language as tl
from cuda_timing import print_bandwidths

from torchtitan.models.llama3 import get_model_args


def block_numels(flavor: str) -> list[int]:
    a = get_model_args(flavor)
    dim, kv, hidden = a.dim, a.kv_heads * a.head_dim, a.ffn_hidden_dim
    return [dim * dim, kv * dim, kv * dim, dim * dim, hidden * dim, dim * hidden, hidden * dim]
    # (the two norms, 4,096 elements each, left out: their copies are launches, not bytes)


@triton.jit
def _copy_rows(src, dst, n, src_stride, dst_stride, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = tl.program_id(1).to(tl.int64)
    mask = offs < n
    x = tl.load(src + row * src_stride + offs, mask=mask)
    tl.store(dst + row * dst_stride + offs, x, mask=mask)


def torch_copy_out(gathered: torch.Tensor, outs: list[torch.Tensor], sizes: list[int]) -> None:
    torch.split_with_sizes_copy(gathered, sizes, dim=1, out=outs)


def triton_copy_out(gathered, outs, sizes, block: int = 1024) -> None:
    offset = 0
    for out, n in zip(outs, sizes):
        grid = (triton.cdiv(n, block), gathered.shape[0])  # the long one first (2^31 - 1)
        _copy_rows[grid](gathered[:, offset:], out, n, gathered.stride(0), n, BLOCK=block)
        offset += n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="8B")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--iters", type=int, default=50)
    a = p.parse_args()
    sizes = [n // a.world for n in block_numels(a.flavor)]
    gathered = torch.randn(a.world, sum(sizes), device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(a.world, n, device="cuda", dtype=torch.bfloat16) for n in sizes]
    checks = [torch.zeros_like(o) for o in outs]
    torch_copy_out(gathered, outs, sizes)
    triton_copy_out(gathered, checks, sizes)
    same = all(torch.equal(x, y) for x, y in zip(outs, checks))
    numel = gathered.numel()
    print(
        f"{torch.cuda.get_device_name()}; {a.flavor} block, world {a.world}: {numel / 1e6:.1f} M "
        f"bf16 parameters; the same tensors both ways: {same}"
    )
    moved = numel * 4  # bf16 read and written
    variants = [("split_with_sizes_copy", torch_copy_out)]
    variants += [(f"triton {b}", functools.partial(triton_copy_out, block=b)) for b in (1024, 4096)]
    print_bandwidths(variants, (gathered, outs, sizes), moved, a.iters)


if __name__ == "__main__":
    main()
