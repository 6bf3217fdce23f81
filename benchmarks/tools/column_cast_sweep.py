"""Time rowwise float8's column-wise cast kernels (torchtitan/float8/cast_kernel.py) over
block sizes, on the 8B block's operand shapes, and print the fastest settings per shape.

    python benchmarks/tools/column_cast_sweep.py [--rows 8192]

``column_amax`` reads each bf16 element once, ``cast_transposed`` reads it and writes one byte,
so each line also gives the bandwidth (bytes moved / time). Settings go in through the module's
constants, which both functions read at each call.
"""

from __future__ import annotations

import argparse
import itertools

import torch
from triton.testing import do_bench

from torchtitan.float8 import cast_kernel as kernels

WIDTHS = (4096, 1024, 14336)  # the 8B block's operand widths: dim, K/V, the SwiGLU's hidden


def time_amax(x: torch.Tensor, cols: int, rows: int, per_program: int, warps: int) -> float:
    kernels.AMAX_COLS, kernels.AMAX_ROWS = cols, rows
    kernels.AMAX_ROWS_PER_PROGRAM, kernels.AMAX_WARPS = per_program, warps
    want = x.abs().amax(0, keepdim=True).float()
    assert torch.equal(kernels.column_amax(x), want)
    return do_bench(lambda: kernels.column_amax(x), warmup=10, rep=50)


def time_cast(x: torch.Tensor, scale: torch.Tensor, rows: int, cols: int, warps: int) -> float:
    kernels.BLOCK_ROWS, kernels.BLOCK_COLS, kernels.WARPS = rows, cols, warps
    return do_bench(
        lambda: kernels.cast_transposed(x, scale, torch.float8_e4m3fn), warmup=10, rep=50
    )


def sweep_amax(x: torch.Tensor) -> None:
    nbytes = x.numel() * x.element_size()
    results = []
    for cols, rows, per_program, warps in itertools.product(
        (64, 128, 256), (16, 32, 64), (256, 512, 1024, 2048), (4, 8)
    ):
        if rows > per_program:
            continue
        ms = time_amax(x, cols, rows, per_program, warps)
        results.append((ms, cols, rows, per_program, warps))
    results.sort()
    torch_ms = do_bench(lambda: x.abs().amax(0), warmup=10, rep=50)
    print(f"column_amax {tuple(x.shape)}: torch abs().amax(0) {torch_ms:.4f} ms")
    for ms, cols, rows, per_program, warps in results[:5] + results[-1:]:
        print(
            f"  cols {cols} rows {rows} rows/program {per_program} warps {warps}: "
            f"{ms:.4f} ms, {nbytes / ms / 1e6:.0f} GB/s"
        )


def sweep_cast(x: torch.Tensor) -> None:
    nbytes = x.numel() * (x.element_size() + 1)
    scale = torch.rand(1, x.shape[1], device=x.device) + 0.5
    results = []
    for rows, cols, warps in itertools.product((32, 64, 128), (32, 64, 128), (4, 8)):
        results.append((time_cast(x, scale, rows, cols, warps), rows, cols, warps))
    results.sort()
    print(f"cast_transposed {tuple(x.shape)}, a scale per column:")
    for ms, rows, cols, warps in results[:5] + results[-1:]:
        print(f"  {rows} x {cols}, warps {warps}: {ms:.4f} ms, {nbytes / ms / 1e6:.0f} GB/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8192)
    args = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    defaults = {name: getattr(kernels, name) for name in dir(kernels) if name.isupper()}
    for width in WIDTHS:
        x = torch.randn(args.rows, width, device="cuda").bfloat16()
        sweep_amax(x)
        sweep_cast(x)
        for name, value in defaults.items():
            setattr(kernels, name, value)
        ms = time_amax(
            x,
            kernels.AMAX_COLS,
            kernels.AMAX_ROWS,
            kernels.AMAX_ROWS_PER_PROGRAM,
            kernels.AMAX_WARPS,
        )
        print(f"  the module's amax settings: {ms:.4f} ms")


if __name__ == "__main__":
    main()
