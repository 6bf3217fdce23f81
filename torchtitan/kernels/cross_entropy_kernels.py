"""Triton kernels of the in-place cross-entropy (``torchtitan.kernels.inplace_loss``).

One program per row of the (rows x vocab) logits, streaming the row in ``block`` columns:

* ``forward``: the row's log-sum-exp (an online max and sum, one pass over the row) and the
  label's logit (0 where the label is ignored or, for a vocabulary shard, held by another rank).
* ``backward``: ``grad * (softmax - one_hot(label))``, with the softmax taken against a given
  log-sum-exp (the whole vocabulary's, for a shard), written over the logits themselves: the row
  is read once and written once, and no second tensor of the logits' size is allocated.

The logits may be a shard of the vocabulary: ``col_offset`` is the vocabulary index of their
first column, and labels are vocabulary indices.

Both read the logits in their own dtype and compute in fp32, as ``F.cross_entropy`` of
``logits.float()`` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Columns per step and warps per row: measured on an H200 at Llama 3's 128,256-entry vocabulary
# (benchmarks/tools/cross_entropy.py; docs/performance.md).
FORWARD_BLOCK, FORWARD_WARPS = 8192, 8
BACKWARD_BLOCK, BACKWARD_WARPS = 8192, 16


@triton.jit
def _forward_kernel(
    logits_ptr,
    row_stride,
    labels_ptr,
    col_offset,
    lse_ptr,
    picked_ptr,
    n_cols,
    ignore_index,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    peak = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        new_peak = tl.maximum(peak, tl.max(x, axis=0))
        total = total * tl.exp(peak - new_peak) + tl.sum(tl.exp(x - new_peak), axis=0)
        peak = new_peak
    label = tl.load(labels_ptr + row)
    column = label - col_offset
    mine = (label != ignore_index) & (column >= 0) & (column < n_cols)
    picked = tl.load(row_ptr + tl.where(mine, column, 0), mask=mine, other=0.0).to(tl.float32)
    tl.store(lse_ptr + row, peak + tl.log(total))
    tl.store(picked_ptr + row, tl.where(mine, picked, 0.0))


@triton.jit
def _backward_kernel(
    logits_ptr,
    row_stride,
    labels_ptr,
    col_offset,
    lse_ptr,
    grad_ptr,
    n_cols,
    ignore_index,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    label = tl.load(labels_ptr + row)
    column = label - col_offset  # outside [0, n_cols): another rank's column, no one-hot here
    scale = tl.where(label != ignore_index, tl.load(grad_ptr).to(tl.float32), 0.0)
    lse = tl.load(lse_ptr + row)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n_cols
        x = tl.load(row_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        grad = tl.exp(x - lse) * scale
        grad = tl.where(cols == column, grad - scale, grad)
        tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=inside)


def forward(
    logits: torch.Tensor,
    labels: torch.Tensor,
    ignore_index: int,
    col_offset: int = 0,
    block=None,
    warps=None,
):
    """logits (rows, columns; unit column stride), labels (rows,) -> per row, in fp32: the
    log-sum-exp over these columns and the label's logit (0 where not among them). ``block`` and
    ``warps`` override the defaults (for benchmarks/tools/cross_entropy.py)."""
    rows, cols = logits.shape
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    picked = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _forward_kernel[(rows,)](
        logits,
        logits.stride(0),
        labels,
        col_offset,
        lse,
        picked,
        cols,
        ignore_index,
        BLOCK=block or FORWARD_BLOCK,
        num_warps=warps or FORWARD_WARPS,
    )
    return lse, picked


def backward_in_place(
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor,
    ignore_index: int,
    col_offset: int = 0,
    block=None,
    warps=None,
) -> None:
    """Overwrite ``logits`` with ``grad * (exp(logits - lse) - one_hot(labels))``; ``grad`` a
    0-d tensor, ``lse`` per row (the whole vocabulary's)."""
    rows, cols = logits.shape
    _backward_kernel[(rows,)](
        logits,
        logits.stride(0),
        labels,
        col_offset,
        lse,
        grad,
        cols,
        ignore_index,
        BLOCK=block or BACKWARD_BLOCK,
        num_warps=warps or BACKWARD_WARPS,
    )
