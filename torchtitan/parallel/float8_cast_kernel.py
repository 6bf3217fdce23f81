"""Triton kernels of our tensorwise float8 casts.

``cast_transposed`` (``float8_cast_transposed``, torchtitan/parallel/float8_transposed_cast.py):
each program loads one (BLOCK_ROWS x BLOCK_COLS) tile of a row-major high-precision matrix with
coalesced reads, scales and saturates it in fp32 as torchao's cast does, and stores the tile's
transpose into the (cols x rows) output; Triton stages the tile through shared memory so the
stores are coalesced too. Fused into a row reduction by inductor, the same cast stored single
bytes a whole row apart (docs/performance.md, findings 24 and 25).

``cast`` (FSDP's float8 all-gather, torchtitan/parallel/float8_all_gather.py): the same
arithmetic over a contiguous tensor in one pass, where torchao's eager cast launches three
kernels (scale, saturate, convert) and moves 17 bytes per float32 element instead of 5.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Not tuned: at 64 x 64 and 4 warps one 8,192 x 4,096 bf16 cast took 0.027 ms on an H200 (call
# 68), about 3.5 TB/s read and written, most of the card's bandwidth.
BLOCK_ROWS, BLOCK_COLS, WARPS = 64, 64, 4

TRITON_FLOAT8 = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e5m2: tl.float8e5}


@triton.jit
def _cast_transposed_kernel(
    x_ptr,
    row_stride,
    scale_ptr,
    out_ptr,
    n_rows,
    n_cols,
    max_value,
    OUT_DTYPE: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    inside = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * row_stride + cols[None, :], mask=inside, other=0.0)
    scaled = x.to(tl.float32) * tl.load(scale_ptr)
    bits = tl.clamp(scaled, -max_value, max_value).to(OUT_DTYPE)
    tl.store(out_ptr + cols[None, :] * n_rows + rows[:, None], bits, mask=inside)


def cast_transposed(
    x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype
) -> torch.Tensor:
    """``x`` (rows x cols, unit column stride) scaled, saturated and cast to ``float8_dtype``,
    as a new (cols x rows) row-major tensor."""
    n_rows, n_cols = x.shape
    out = torch.empty(n_cols, n_rows, dtype=float8_dtype, device=x.device)
    grid = (triton.cdiv(n_rows, BLOCK_ROWS), triton.cdiv(n_cols, BLOCK_COLS))
    _cast_transposed_kernel[grid](
        x,
        x.stride(0),
        scale,
        out,
        n_rows,
        n_cols,
        torch.finfo(float8_dtype).max,
        OUT_DTYPE=TRITON_FLOAT8[float8_dtype],
        BLOCK_ROWS=BLOCK_ROWS,
        BLOCK_COLS=BLOCK_COLS,
        num_warps=WARPS,
    )
    return out


# Not tuned either: 4,096 elements (16 per thread) per program.
FLAT_BLOCK, FLAT_WARPS = 4096, 8


@triton.jit
def _cast_kernel(
    x_ptr, scale_ptr, out_ptr, n, max_value, OUT_DTYPE: tl.constexpr, BLOCK: tl.constexpr
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    scaled = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32) * tl.load(scale_ptr)
    bits = tl.clamp(scaled, -max_value, max_value).to(OUT_DTYPE)
    tl.store(out_ptr + offsets, bits, mask=inside)


def cast(x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype) -> torch.Tensor:
    """Contiguous ``x`` scaled, saturated and cast to ``float8_dtype``, in its shape."""
    out = torch.empty_like(x, dtype=float8_dtype)
    n = x.numel()
    _cast_kernel[(triton.cdiv(n, FLAT_BLOCK),)](
        x,
        scale,
        out,
        n,
        torch.finfo(float8_dtype).max,
        OUT_DTYPE=TRITON_FLOAT8[float8_dtype],
        BLOCK=FLAT_BLOCK,
        num_warps=FLAT_WARPS,
    )
    return out
