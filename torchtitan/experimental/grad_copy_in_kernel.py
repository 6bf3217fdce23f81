"""The Triton kernel of :mod:`torchtitan.experimental.grad_copy_in` (imported only where it
runs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_chunks(src, dst, chunk, dst_stride, BLOCK: tl.constexpr):
    """Elements ``program_id(0) * BLOCK ...`` of chunk ``program_id(1)`` of src (contiguous
    chunks of ``chunk`` elements) into the row of the same index of dst (rows ``dst_stride``
    apart), cast to dst's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rank = tl.program_id(1).to(tl.int64)
    mask = offs < chunk
    x = tl.load(src + rank * chunk + offs, mask=mask)
    tl.store(dst + rank * dst_stride + offs, x.to(dst.dtype.element_ty), mask=mask)


def grid(chunk: int, chunks: int, block: int) -> tuple[int, int]:
    """The blocks along the grid's first dimension (up to 2^31 - 1 programs): the second and
    third take at most 65,535, fewer than an 8B output head's 525 M gradients need per rank."""
    blocks = triton.cdiv(chunk, block)
    if blocks >= 2**31 or chunks > 65535:
        raise ValueError(f"{chunks} chunks of {chunk} elements exceed a CUDA grid")
    return blocks, chunks


def copy_chunks(src: torch.Tensor, dst: torch.Tensor, chunk: int, dst_stride: int, block: int):
    _copy_chunks[grid(chunk, src.numel() // chunk, block)](src, dst, chunk, dst_stride, BLOCK=block)
