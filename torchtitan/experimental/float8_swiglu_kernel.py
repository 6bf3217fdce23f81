"""Triton kernels of the fused float8 SwiGLU backward (torchtitan/experimental/float8_swiglu.py).

Both read the same three (tokens x hidden) bf16 matrices: the gradient of the SwiGLU product
``dh`` and the two projections ``a1`` (gate, under SiLU) and ``a3``, and compute per element, in
float32 and rounding to bf16 where eager autograd's ops do (so the values are the unfused
backward's, up to the exponential's last bit):

    e = exp(-a1)                 s = 1 / (1 + e)
    silu = bf16(a1 / (1 + e))    h = bf16(silu * a3)
    da3 = bf16(dh * silu)        da1 = bf16(bf16(dh * a3) * s * (1 + a1 * (1 - s)))

``grad_amax``: the largest ``|da1|`` and ``|da3|`` (the tensorwise scales' amaxes), each program
reducing a run of elements and merging with an integer atomic max (non-negative floats order as
their bits do, and the positive NaN after them all: a NaN gradient gives a NaN amax, as
``torch.max`` does).

``grad_cast``: one (BLOCK_ROWS x BLOCK_COLS) tile per program; ``da1`` and ``da3`` scaled by the
scales their amaxes give (torchao's ``amax_to_scale``, computed in the kernel and written out by
the first program) and ``h`` by the forward's scale, saturated and cast to float8, stored
row-major (da1, da3, for the input-gradient matmuls) and transposed (da1, da3, h, for the
weight-gradient matmuls). The unfused compiled backward has the same two passes, fused by
inductor: one reduction for the amaxes and one pointwise kernel writing the five operands, at 3.1
and 2.5 TB/s inside the compiled 1B block on an H200; these kernels ran at 4.1 and 3.3 TB/s alone
(docs/performance.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchtitan.float8.cast_kernel import TRITON_FLOAT8, _scale_of_amax

# grad_cast's tile and warps; grad_amax's block, blocks per program and warps: the fastest of 18
# settings each on an H200 at the 1B (32,768 x 8,192) and 8B (8,192 x 14,336) shapes, the same
# for both (benchmarks/tools/swiglu_cast_sweep.py, 2026-12-01): grad_cast 0.886 and 0.389 ms
# (3.3 TB/s),
# grad_amax 0.393 and 0.184 ms (4.1 and 3.8 TB/s).
CAST_ROWS, CAST_COLS, CAST_WARPS = 32, 64, 4
AMAX_BLOCK, AMAX_BLOCKS_PER_PROGRAM, AMAX_WARPS = 1024, 16, 8


@triton.jit
def _swiglu_grads(dh, a1, a3):
    """(da1, da3, h) of one tile, in float32, rounded to bf16 as eager's ops round them."""
    dh = dh.to(tl.float32)
    a1 = a1.to(tl.float32)
    a3 = a3.to(tl.float32)
    denominator = 1.0 + tl.exp(-a1)  # as torch's SiLU and its backward compute it
    sig = 1.0 / denominator
    silu = (a1 / denominator).to(tl.bfloat16).to(tl.float32)
    h = (silu * a3).to(tl.bfloat16).to(tl.float32)
    da3 = (dh * silu).to(tl.bfloat16).to(tl.float32)
    d_silu = (dh * a3).to(tl.bfloat16).to(tl.float32)
    da1 = (d_silu * sig * (1.0 + a1 * (1.0 - sig))).to(tl.bfloat16).to(tl.float32)
    return da1, da3, h


@triton.jit
def _grad_amax_kernel(
    dh_ptr, a1_ptr, a3_ptr, out_ptr, n, BLOCK: tl.constexpr, BLOCKS_PER_PROGRAM: tl.constexpr
):
    first = tl.program_id(0).to(tl.int64) * BLOCK * BLOCKS_PER_PROGRAM
    amax1 = tl.zeros([BLOCK], dtype=tl.float32)
    amax3 = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(BLOCKS_PER_PROGRAM):
        offsets = first + i * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        dh = tl.load(dh_ptr + offsets, mask=inside, other=0.0)
        a1 = tl.load(a1_ptr + offsets, mask=inside, other=0.0)
        a3 = tl.load(a3_ptr + offsets, mask=inside, other=0.0)
        da1, da3, _ = _swiglu_grads(dh, a1, a3)
        amax1 = tl.maximum(amax1, tl.abs(da1), propagate_nan=tl.PropagateNan.ALL)
        amax3 = tl.maximum(amax3, tl.abs(da3), propagate_nan=tl.PropagateNan.ALL)
    tl.atomic_max(out_ptr, _max_or_nan(amax1).to(tl.int32, bitcast=True))
    tl.atomic_max(out_ptr + 1, _max_or_nan(amax3).to(tl.int32, bitcast=True))


@triton.jit
def _max_or_nan(values):
    """The largest of non-negative ``values``, or a (positive) NaN if one is NaN: ``tl.max``
    alone would skip it."""
    largest = tl.max(values, axis=0)
    return tl.where(tl.max((values != values).to(tl.int32), axis=0) > 0, float("nan"), largest)


def grad_amax(dh: torch.Tensor, a1: torch.Tensor, a3: torch.Tensor) -> torch.Tensor:
    """``[max |da1|, max |da3|]`` as a float32 tensor of two (inputs contiguous, one shape)."""
    n = dh.numel()
    out = torch.zeros(2, dtype=torch.int32, device=dh.device)
    grid = (triton.cdiv(n, AMAX_BLOCK * AMAX_BLOCKS_PER_PROGRAM),)
    _grad_amax_kernel[grid](
        dh,
        a1,
        a3,
        out,
        n,
        BLOCK=AMAX_BLOCK,
        BLOCKS_PER_PROGRAM=AMAX_BLOCKS_PER_PROGRAM,
        num_warps=AMAX_WARPS,
    )
    return out.view(torch.float32)


@triton.jit
def _store_float8(value, scale, max_value, ptr, offsets, inside, OUT_DTYPE: tl.constexpr):
    bits = tl.clamp(value * scale, -max_value, max_value, propagate_nan=tl.PropagateNan.ALL)
    tl.store(ptr + offsets, bits.to(OUT_DTYPE), mask=inside)


@triton.jit
def _grad_cast_kernel(
    dh_ptr,
    a1_ptr,
    a3_ptr,
    amax_ptr,
    h_scale_ptr,
    scales_ptr,
    da1_ptr,
    da1_t_ptr,
    da3_ptr,
    da3_t_ptr,
    h_t_ptr,
    n_rows,
    n_cols,
    grad_max,
    input_max,
    GRAD_DTYPE: tl.constexpr,
    INPUT_DTYPE: tl.constexpr,
    ROUND_TO_POWER_OF_2: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    inside = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    row_major = rows[:, None] * n_cols + cols[None, :]
    transposed = cols[None, :] * n_rows + rows[:, None]
    dh = tl.load(dh_ptr + row_major, mask=inside, other=0.0)
    a1 = tl.load(a1_ptr + row_major, mask=inside, other=0.0)
    a3 = tl.load(a3_ptr + row_major, mask=inside, other=0.0)
    da1, da3, h = _swiglu_grads(dh, a1, a3)
    scale1 = _scale_of_amax(tl.load(amax_ptr), grad_max, ROUND_TO_POWER_OF_2)
    scale3 = _scale_of_amax(tl.load(amax_ptr + 1), grad_max, ROUND_TO_POWER_OF_2)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(scales_ptr, scale1)
        tl.store(scales_ptr + 1, scale3)
    h_scale = tl.load(h_scale_ptr)
    _store_float8(da1, scale1, grad_max, da1_ptr, row_major, inside, GRAD_DTYPE)
    _store_float8(da3, scale3, grad_max, da3_ptr, row_major, inside, GRAD_DTYPE)
    _store_float8(da1, scale1, grad_max, da1_t_ptr, transposed, inside, GRAD_DTYPE)
    _store_float8(da3, scale3, grad_max, da3_t_ptr, transposed, inside, GRAD_DTYPE)
    _store_float8(h, h_scale, input_max, h_t_ptr, transposed, inside, INPUT_DTYPE)


def grad_cast(
    dh: torch.Tensor,
    a1: torch.Tensor,
    a3: torch.Tensor,
    amax: torch.Tensor,
    h_scale: torch.Tensor,
    grad_dtype: torch.dtype,
    input_dtype: torch.dtype,
    round_to_power_of_2: bool,
    rows: int = CAST_ROWS,
    cols: int = CAST_COLS,
    warps: int = CAST_WARPS,
) -> tuple[torch.Tensor, ...]:
    """(da1, da1ᵀ, da3, da3ᵀ, hᵀ, scales): the float8 operands of the SwiGLU's backward
    matmuls, each transposed one a new row-major (hidden x tokens) tensor, and the two gradients'
    scales (float32, two). Inputs contiguous (tokens x hidden); ``amax`` from ``grad_amax``."""
    from torchtitan.experimental.float8_swiglu import empty_operands

    n_rows, n_cols = dh.shape
    operands = empty_operands(dh, grad_dtype, input_dtype)
    da1, da1_t, da3, da3_t, h_t, scales = operands
    grid = (triton.cdiv(n_rows, rows), triton.cdiv(n_cols, cols))
    _grad_cast_kernel[grid](
        dh,
        a1,
        a3,
        amax,
        h_scale,
        scales,
        da1,
        da1_t,
        da3,
        da3_t,
        h_t,
        n_rows,
        n_cols,
        torch.finfo(grad_dtype).max,
        torch.finfo(input_dtype).max,
        GRAD_DTYPE=TRITON_FLOAT8[grad_dtype],
        INPUT_DTYPE=TRITON_FLOAT8[input_dtype],
        ROUND_TO_POWER_OF_2=round_to_power_of_2,
        BLOCK_ROWS=rows,
        BLOCK_COLS=cols,
        num_warps=warps,
    )
    return operands
