"""Summed cross-entropy whose backward writes the logits' gradient over the logits.

``F.cross_entropy`` (eager or compiled) keeps the logits for its backward and then allocates their
gradient beside them: at the step's peak, the start of the backward, two tensors of
tokens x vocabulary exist (2 x 7.8 GiB for 32,768 tokens of Llama 3's 128,256-entry vocabulary
in bf16). The logits are needed by nothing after the loss's own backward (the output head's
backward reads its input and weight, not its output), so ``inplace_cross_entropy_sum`` computes
``softmax - one_hot(label)`` into the logits' own storage and hands that to autograd as their
gradient. On CUDA both passes are Triton kernels (``torchtitan.cross_entropy_kernels``) that read
each row once (forward) or read and write it once (backward); elsewhere the same arithmetic runs
as torch ops, a block of rows at a time.

The logits' values are gone after the backward. A second backward through the same graph
(``retain_graph``) therefore raises, and so does any other autograd node that saved the same
logits (autograd's in-place check), instead of computing with overwritten values.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
from torch.distributed.tensor import DTensor

IGNORE_INDEX = -100  # F.cross_entropy's default: label positions that do not count
_ROWS_PER_BLOCK = 1024  # the torch path's fp32 working set: this many rows at a time


def in_place_chosen(choice: str, vocab_sharded: bool, cuda: bool) -> bool:
    """Whether ``--training.logits_loss`` ``choice`` runs this loss: ``in_place`` always,
    ``auto`` on CUDA when each rank's logits hold the whole vocabulary (no TP loss parallel)."""
    if choice == "auto":
        return cuda and not vocab_sharded
    return choice == "in_place"


def in_place_problem(choice: str, vocab_sharded: bool, cuda: bool) -> str | None:
    """Why ``--training.logits_loss`` ``choice`` cannot run here, or None."""
    if choice != "in_place":
        return None
    if vocab_sharded:
        return (
            "--training.logits_loss in_place needs logits that hold the whole vocabulary, but "
            "tensor parallel shards it (loss parallel); use auto or standard, or "
            "--parallelism.disable_loss_parallel"
        )
    if cuda and importlib.util.find_spec("triton") is None:
        return (
            "--training.logits_loss in_place needs Triton on CUDA (pip install triton); "
            "or use standard"
        )
    return None


def inplace_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits (..., vocab), labels (...) -> the fp32 summed loss, equal to
    ``F.cross_entropy(logits.float(), labels, reduction="sum")``; the backward overwrites
    ``logits`` with their gradient (cast to their dtype)."""
    if isinstance(logits, DTensor):
        raise ValueError(
            "the in-place loss takes logits that hold the whole vocabulary as a plain tensor, "
            f"but got a DTensor ({logits.placements}); use --training.logits_loss standard"
        )
    flat = logits.view(-1, logits.shape[-1]) if logits.stride(-1) == 1 else None
    if flat is None:  # the kernels need unit column stride; a copy still saves nothing
        flat = logits.reshape(-1, logits.shape[-1]).contiguous()
    labels = labels.reshape(-1)
    if not torch.is_grad_enabled() or not logits.requires_grad:
        return _forward(flat, labels)[1].sum()
    return _InPlaceCrossEntropySum.apply(flat, labels).view(())


class _InPlaceCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels):
        lse, row_loss = _forward(logits, labels)
        ctx.save_for_backward(logits, labels, lse)
        ctx.used = False
        return row_loss.sum()

    @staticmethod
    def backward(ctx, grad):
        if ctx.used:
            raise RuntimeError(
                "the in-place cross-entropy's backward ran twice (retain_graph): its first run "
                "overwrote the logits; use --training.loss_impl compiled for such graphs"
            )
        ctx.used = True
        logits, labels, lse = ctx.saved_tensors
        _backward_in_place(logits, labels, lse, grad.to(torch.float32))
        return logits, None


def _forward(logits: torch.Tensor, labels: torch.Tensor):
    kernels = _triton_kernels(logits)
    if kernels is not None:
        return kernels.forward(logits, labels, IGNORE_INDEX)
    lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for rows in _row_blocks(logits.shape[0]):
        lse[rows] = torch.logsumexp(logits[rows].float(), dim=-1)
    keep = labels != IGNORE_INDEX
    picked = logits.gather(1, torch.where(keep, labels, 0)[:, None]).squeeze(1).float()
    return lse, torch.where(keep, lse - picked, 0.0)


def _backward_in_place(logits, labels, lse, grad) -> None:
    kernels = _triton_kernels(logits)
    if kernels is not None:
        return kernels.backward_in_place(logits, labels, lse, grad, IGNORE_INDEX)
    keep = labels != IGNORE_INDEX
    scale = torch.where(keep, grad, 0.0)
    safe = torch.where(keep, labels, 0)
    for rows in _row_blocks(logits.shape[0]):
        g = torch.exp(logits[rows].float() - lse[rows, None]) * scale[rows, None]
        g.scatter_add_(1, safe[rows, None], -scale[rows, None])
        logits[rows] = g.to(logits.dtype)


def _row_blocks(n: int):
    return (slice(i, i + _ROWS_PER_BLOCK) for i in range(0, n, _ROWS_PER_BLOCK))


def _triton_kernels(logits: torch.Tensor):
    """The Triton kernels for CUDA tensors (or any tensor under Triton's CPU interpreter,
    ``TRITON_INTERPRET=1``, which the CPU tests use); None for the torch path."""
    if logits.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return _import_kernels()
    return None


@functools.cache
def _import_kernels():
    from torchtitan import cross_entropy_kernels

    return cross_entropy_kernels
