"""Time the fused float8 SwiGLU backward's kernels (torchtitan/experimental/float8_swiglu_kernel.py)
over tile sizes on the 1B and 8B shapes, against the same computation compiled by inductor from
torch ops (what the unfused backward's kernels do).

    python benchmarks/tools/swiglu_cast_sweep.py [--shapes 32768x8192 8192x14336]

Bytes moved: ``grad_amax`` reads three bf16 inputs (6 bytes per element); ``grad_cast`` reads
them and writes five float8 outputs (11 bytes per element).
"""

from __future__ import annotations

import argparse
import functools
import itertools

import torch
from torchao.float8.float8_utils import amax_to_scale, to_fp8_saturated
from triton.testing import do_bench

from torchtitan.experimental import float8_swiglu_kernel as kernel
from torchtitan.experimental.float8_swiglu import swiglu_grads_in_torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def inputs(tokens: int, hidden: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [
        (torch.randn(tokens, hidden, device="cuda", generator=g) * std).bfloat16()
        for std in (1e-4, 2.0, 1.5)
    ]


def unfused(dh, a1, a3, h_scale):
    """The five operands and two scales from torch ops, as the unfused backward computes them."""
    da1, da3, h = swiglu_grads_in_torch(dh, a1, a3)
    s1, s3 = (amax_to_scale(g.abs().max(), E5M2) for g in (da1, da3))
    g1, g3 = to_fp8_saturated(da1.float() * s1, E5M2), to_fp8_saturated(da3.float() * s3, E5M2)
    h_t = to_fp8_saturated(h.float() * h_scale, E4M3).t().contiguous()
    return g1, g1.t().contiguous(), g3, g3.t().contiguous(), h_t, s1, s3


def sweep(tokens: int, hidden: int) -> None:
    dh, a1, a3 = inputs(tokens, hidden)
    n = tokens * hidden
    h_scale = torch.tensor(17.0, device="cuda")
    torch._dynamo.reset()  # else the second shape recompiles for dynamic shapes (slower kernels)
    compiled = torch.compile(unfused)
    ms = do_bench(lambda: compiled(dh, a1, a3, h_scale), warmup=10, rep=100)
    print(f"{tokens} x {hidden}: inductor's kernels (amaxes + casts) {ms:.3f} ms")
    amax_results = []
    for block, per_program, warps in itertools.product((1024, 2048, 4096), (4, 8, 16), (4, 8)):
        kernel.AMAX_BLOCK, kernel.AMAX_BLOCKS_PER_PROGRAM, kernel.AMAX_WARPS = (
            block,
            per_program,
            warps,
        )
        ms = do_bench(lambda: kernel.grad_amax(dh, a1, a3), warmup=10, rep=100)
        amax_results.append((ms, block, per_program, warps))
    amax_results.sort()
    amax = kernel.grad_amax(dh, a1, a3)
    cast_results = []
    for rows, cols, warps in itertools.product((32, 64, 128), (32, 64, 128), (4, 8)):
        cast = functools.partial(
            kernel.grad_cast, dh, a1, a3, amax, h_scale, E5M2, E4M3, False, rows, cols, warps
        )
        ms = do_bench(cast, warmup=10, rep=100)
        cast_results.append((ms, rows, cols, warps))
    cast_results.sort()
    for ms, block, per_program, warps in amax_results[:3] + amax_results[-1:]:
        print(
            f"  grad_amax block {block} x {per_program} per program, {warps} warps: {ms:.3f} ms "
            f"{6 * n / ms / 1e9:.2f} TB/s"
        )
    for ms, rows, cols, warps in cast_results[:4] + cast_results[-1:]:
        print(
            f"  grad_cast tile {rows} x {cols}, {warps} warps: {ms:.3f} ms "
            f"{11 * n / ms / 1e9:.2f} TB/s"
        )
    best = amax_results[0][0] + cast_results[0][0]
    print(f"  ours, best settings: {best:.3f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["32768x8192", "8192x14336"])
    args = p.parse_args()
    print(torch.cuda.get_device_name())
    for shape in args.shapes:
        sweep(*map(int, shape.split("x")))


if __name__ == "__main__":
    main()
