"""Triton kernels of our float8 casts.

``cast_transposed`` (``float8_cast_transposed``, torchtitan/float8/transposed_cast.py):
each program loads one (BLOCK_ROWS x BLOCK_COLS) tile of a row-major high-precision matrix with
coalesced reads, scales and saturates it in fp32 as torchao's cast does, and stores the tile's
transpose into the (cols x rows) output; Triton stages the tile through shared memory so the
stores are coalesced too. Fused into a row reduction by inductor, the same cast stored single
bytes a whole row apart (docs/performance.md).

``cast_columnwise_from_amax`` is the column-wise cast of rowwise float8 (``float8_cast_columnwise``,
torchtitan/float8/rowwise_matmul.py): the same tiled transposed cast, each column scaled
by the scale its amax gives (computed in the kernel, as torchao's ``amax_to_scale`` computes it,
and written out by the first row of programs), after ``column_amax`` computed those amaxes in one
read: each program reduces a block of columns over a range of rows and merges its maxima with an
atomic max. Two kernels per cast; the scale math in eager took seven more (docs/performance.md).

``cast`` (FSDP's float8 all-gather, torchtitan/float8/all_gather.py): the same
arithmetic over a contiguous tensor in one pass, where torchao's eager cast launches three
kernels (scale, saturate, convert) and moves 17 bytes per float32 element instead of 5.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# The fastest of 18 settings on an H200 for 8,192 rows of 1,024, 4,096 and 14,336 bf16 columns
# with a scale per column (benchmarks/tools/column_cast_sweep.py, one H200, 2026-11-29): 0.031 ms
# at 4,096 wide,
# about 3.2 TB/s read and written.
BLOCK_ROWS, BLOCK_COLS, WARPS = 64, 128, 4

TRITON_FLOAT8 = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e5m2: tl.float8e5}


# torchao's float8_utils.EPS: amax_to_scale clamps the amax (in float64) to at least this.
AMAX_EPS: tl.constexpr = tl.constexpr(1e-12)


@triton.jit
def _scale_of_amax(amax, max_value, ROUND_TO_POWER_OF_2: tl.constexpr):
    """torchao's ``amax_to_scale``, step for step: ``max_value / max(amax, 1e-12)`` in float64,
    to float32, then ``exp2(floor(log2(.)))`` through the libdevice functions torch's CUDA
    kernels use, so the bits are torch's."""
    eps = tl.full(amax.shape, AMAX_EPS, tl.float64)
    amax = amax.to(tl.float64)
    clamped = tl.where(amax < eps, eps, amax)  # NaN stays NaN, as under torch.clamp
    # float64 division lowers to the correctly rounded div.rn.f64 (float32's would not).
    scale = (tl.cast(max_value, tl.float64) / clamped).to(tl.float32)
    if ROUND_TO_POWER_OF_2:
        scale = libdevice.exp2(libdevice.floor(libdevice.log2(scale)))
    return scale


@triton.jit
def _cast_transposed_kernel(
    x_ptr,
    row_stride,
    scale_ptr,
    amax_ptr,
    out_ptr,
    n_rows,
    n_cols,
    max_value,
    OUT_DTYPE: tl.constexpr,
    SCALE_PER_COLUMN: tl.constexpr,
    SCALE_FROM_AMAX: tl.constexpr,
    ROUND_TO_POWER_OF_2: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    inside = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * row_stride + cols[None, :], mask=inside, other=0.0)
    if SCALE_FROM_AMAX:
        amax = tl.load(amax_ptr + cols, mask=cols < n_cols, other=1.0)
        column_scale = _scale_of_amax(amax, max_value, ROUND_TO_POWER_OF_2)
        if tl.program_id(0) == 0:
            tl.store(scale_ptr + cols, column_scale, mask=cols < n_cols)
        scale = column_scale[None, :]
    elif SCALE_PER_COLUMN:
        scale = tl.load(scale_ptr + cols, mask=cols < n_cols, other=1.0)[None, :]
    else:
        scale = tl.load(scale_ptr)
    scaled = x.to(tl.float32) * scale
    bits = tl.clamp(scaled, -max_value, max_value, propagate_nan=tl.PropagateNan.ALL)
    bits = bits.to(OUT_DTYPE)
    tl.store(out_ptr + cols[None, :] * n_rows + rows[:, None], bits, mask=inside)


def _launch_cast_transposed(x, scale, amax, float8_dtype, round_to_power_of_2=False):
    """The tiled transposed cast: by ``scale`` (read), or with ``amax`` by the scales computed
    from it (written into ``scale``)."""
    n_rows, n_cols = x.shape
    out = torch.empty(n_cols, n_rows, dtype=float8_dtype, device=x.device)
    grid = (triton.cdiv(n_rows, BLOCK_ROWS), triton.cdiv(n_cols, BLOCK_COLS))
    _cast_transposed_kernel[grid](
        x,
        x.stride(0),
        scale,
        amax,
        out,
        n_rows,
        n_cols,
        torch.finfo(float8_dtype).max,
        OUT_DTYPE=TRITON_FLOAT8[float8_dtype],
        SCALE_PER_COLUMN=scale.numel() > 1,
        SCALE_FROM_AMAX=amax is not None,
        ROUND_TO_POWER_OF_2=round_to_power_of_2,
        BLOCK_ROWS=BLOCK_ROWS,
        BLOCK_COLS=BLOCK_COLS,
        num_warps=WARPS,
    )
    return out


def cast_transposed(
    x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype
) -> torch.Tensor:
    """``x`` (rows x cols, unit column stride) scaled, saturated and cast to ``float8_dtype``,
    as a new (cols x rows) row-major tensor; ``scale`` one value, or one per column (1 x cols,
    contiguous)."""
    return _launch_cast_transposed(x, scale, None, float8_dtype)


def cast_columnwise_from_amax(
    x: torch.Tensor, amax: torch.Tensor, float8_dtype: torch.dtype, round_to_power_of_2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (rows x cols, unit column stride) cast with one scale per column, the scale of the
    column's ``amax`` (1 x cols float32) as torchao's ``amax_to_scale`` computes it: returns the
    (cols x rows) row-major bits and the (1 x cols) float32 scales."""
    scale = torch.empty(1, x.shape[1], dtype=torch.float32, device=x.device)
    out = _launch_cast_transposed(x, scale, amax, float8_dtype, round_to_power_of_2)
    return out, scale


# The fastest of 72 settings on an H200 for the same shapes (2026-11-29): 64 columns by 64 rows at a
# time, 256 rows per program; 0.038 ms at 8,192 x 4,096 (1.8 TB/s) and 0.094 ms at 8,192 x 14,336
# (2.5 TB/s), against 0.066 and 0.160 ms with 128 columns, 32 rows and 1,024 rows per program.
AMAX_COLS, AMAX_ROWS, AMAX_ROWS_PER_PROGRAM, AMAX_WARPS = 64, 64, 256, 4


@triton.jit
def _column_amax_kernel(
    x_ptr,
    row_stride,
    out_ptr,
    n_rows,
    n_cols,
    ROWS_PER_PROGRAM: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    cols = tl.program_id(0).to(tl.int64) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    first = tl.program_id(1).to(tl.int64) * ROWS_PER_PROGRAM
    amax = tl.zeros([BLOCK_COLS], dtype=tl.float32)
    for start in range(0, ROWS_PER_PROGRAM, BLOCK_ROWS):
        rows = first + start + tl.arange(0, BLOCK_ROWS)
        inside = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        x = tl.load(x_ptr + rows[:, None] * row_stride + cols[None, :], mask=inside, other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), axis=0))
    # Non-negative floats order as their bits do, so an integer atomic max merges the programs.
    tl.atomic_max(out_ptr + cols, amax.to(tl.int32, bitcast=True), mask=cols < n_cols)


def column_amax(x: torch.Tensor) -> torch.Tensor:
    """The largest absolute value of each column of ``x`` (rows x cols, unit column stride), as
    a float32 (1 x cols) tensor."""
    n_rows, n_cols = x.shape
    out = torch.zeros(1, n_cols, dtype=torch.int32, device=x.device)
    grid = (triton.cdiv(n_cols, AMAX_COLS), triton.cdiv(n_rows, AMAX_ROWS_PER_PROGRAM))
    _column_amax_kernel[grid](
        x,
        x.stride(0),
        out,
        n_rows,
        n_cols,
        ROWS_PER_PROGRAM=AMAX_ROWS_PER_PROGRAM,
        BLOCK_ROWS=AMAX_ROWS,
        BLOCK_COLS=AMAX_COLS,
        num_warps=AMAX_WARPS,
    )
    return out.view(torch.float32)


# Not tuned either: 4,096 elements (16 per thread) per program.
FLAT_BLOCK, FLAT_WARPS = 4096, 8


@triton.jit
def _cast_kernel(
    x_ptr, scale_ptr, out_ptr, n, max_value, OUT_DTYPE: tl.constexpr, BLOCK: tl.constexpr
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    scaled = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32) * tl.load(scale_ptr)
    bits = tl.clamp(scaled, -max_value, max_value, propagate_nan=tl.PropagateNan.ALL)
    bits = bits.to(OUT_DTYPE)
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
