"""Summed cross-entropy whose backward writes the logits' gradient over the logits.

``F.cross_entropy`` (eager or compiled) keeps the logits for its backward and then allocates their
gradient beside them: at the step's peak, the start of the backward, two tensors of
tokens x vocabulary exist (2 x 7.8 GiB for 32,768 tokens of Llama 3's 128,256-entry vocabulary
in bf16). The logits are needed by nothing after the loss's own backward (the output head's
backward reads its input and weight, not its output), so ``inplace_cross_entropy_sum`` computes
``softmax - one_hot(label)`` into the logits' own storage and hands that to autograd as their
gradient. On CUDA both passes are Triton kernels (``torchtitan.kernels.cross_entropy_kernels``)
that read each row once (forward) or read and write it once (backward); elsewhere the same
arithmetic runs
as torch ops, a block of rows at a time.

Under TP's loss parallel the logits arrive as a DTensor sharded over the vocabulary: each rank
runs the kernels on its columns, and the rows' log-sum-exp and label logit are reduced across
the TP group (two all-reduces of one float per token) before the loss and the backward.

The logits' values are gone after the backward. A second backward through the same graph
(``retain_graph``) therefore raises, and so does any other autograd node that saved the same
logits (autograd's in-place check), instead of computing with overwritten values.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from torchtitan.kernels.vocab_shard import VocabShard, first_owned_row

IGNORE_INDEX = -100  # F.cross_entropy's default: label positions that do not count
_ROWS_PER_BLOCK = 1024  # the torch path's fp32 working set: this many rows at a time


def in_place_chosen(choice: str, cuda: bool) -> bool:
    """Whether ``--training.logits_loss`` ``choice`` runs this loss: ``in_place`` always,
    ``auto`` on CUDA where Triton is installed (CUDA builds of torch bring it)."""
    return choice == "in_place" or (choice == "auto" and cuda and _has_triton())


def in_place_problem(choice: str, cuda: bool) -> str | None:
    """Why ``--training.logits_loss`` ``choice`` cannot run here, or None."""
    if choice == "in_place" and cuda and not _has_triton():
        return (
            "--training.logits_loss in_place needs Triton on CUDA (pip install triton); "
            "or use standard"
        )
    return None


def inplace_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits (..., vocab), labels (...) -> the fp32 summed loss, equal to
    ``F.cross_entropy(logits.float(), labels, reduction="sum")``; the backward overwrites
    ``logits`` with their gradient (cast to their dtype). ``logits`` may be a DTensor sharded
    over the vocabulary on a 1-D (TP) mesh (loss parallel); the loss is then the whole
    vocabulary's, a plain tensor on every rank of the mesh."""
    shard = None
    if isinstance(logits, DTensor):
        logits, shard = _local_vocab_shard(logits)
    flat = logits.reshape(-1, logits.shape[-1])  # a view wherever the layout allows
    if flat.stride(-1) != 1:  # the kernels need unit column stride; a copy still saves nothing
        flat = flat.contiguous()
    labels = labels.reshape(-1).contiguous()
    if not torch.is_grad_enabled() or not logits.requires_grad:
        return _summed(*_row_stats(flat, labels, shard), labels)
    return _InPlaceCrossEntropySum.apply(flat, labels, shard).view(())


def _local_vocab_shard(logits: DTensor) -> tuple[torch.Tensor, VocabShard]:
    mesh, placements = logits.device_mesh, logits.placements
    last = logits.ndim - 1
    if mesh.ndim != 1 or not (placements[0].is_shard() and placements[0].dim in (-1, last)):
        raise ValueError(
            "the in-place loss takes whole logits or logits sharded over the vocabulary on a "
            f"1-D mesh (loss parallel); got {placements} on a {mesh.ndim}-D mesh"
        )
    start = first_owned_row(logits.shape[-1], mesh.size(), mesh.get_local_rank())
    return logits.to_local(grad_placements=[Shard(last)]), VocabShard(start, mesh.get_group())


class _InPlaceCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, shard):
        lse, picked = _row_stats(logits, labels, shard)
        ctx.save_for_backward(logits, labels, lse)
        ctx.col_offset = shard.start if shard else 0
        ctx.used = False
        return _summed(lse, picked, labels)

    @staticmethod
    def backward(ctx, grad):
        if ctx.used:
            raise RuntimeError(
                "the in-place cross-entropy's backward ran twice (retain_graph): its first run "
                "overwrote the logits; use --training.logits_loss standard for such graphs"
            )
        ctx.used = True
        logits, labels, lse = ctx.saved_tensors
        _backward_in_place(logits, labels, ctx.col_offset, lse, grad.to(torch.float32))
        return logits, None, None


def _summed(lse: torch.Tensor, picked: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.where(labels != IGNORE_INDEX, lse - picked, 0.0).sum()


def _row_stats(logits: torch.Tensor, labels: torch.Tensor, shard: VocabShard | None):
    """Per row: the whole vocabulary's log-sum-exp and the label's logit (fp32)."""
    lse, picked = _local_row_stats(logits, labels, shard.start if shard else 0)
    if shard is None:
        return lse, picked
    peak = lse.clone()
    dist.all_reduce(peak, dist.ReduceOp.MAX, group=shard.group)
    sums = torch.stack([torch.exp(lse - peak), picked])
    dist.all_reduce(sums, group=shard.group)  # one collective for both sums
    return peak + torch.log(sums[0]), sums[1]


def _local_row_stats(logits: torch.Tensor, labels: torch.Tensor, col_offset: int):
    kernels = _triton_kernels(logits)
    if kernels is not None:
        return kernels.forward(logits, labels, IGNORE_INDEX, col_offset)
    lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for rows in _row_blocks(logits.shape[0]):
        lse[rows] = torch.logsumexp(logits[rows].float(), dim=-1)
    if not logits.shape[1]:  # an empty vocabulary shard: no label's column is here
        return lse, torch.zeros_like(lse)
    mine, column = own_columns(labels, col_offset, logits.shape[1])
    picked = logits.gather(1, column[:, None]).squeeze(1).float()
    return lse, torch.where(mine, picked, 0.0)


def _backward_in_place(logits, labels, col_offset: int, lse, grad) -> None:
    kernels = _triton_kernels(logits)
    if kernels is not None:
        return kernels.backward_in_place(logits, labels, lse, grad, IGNORE_INDEX, col_offset)
    if logits.shape[1] == 0:  # an empty vocabulary shard
        return
    scale = torch.where(labels != IGNORE_INDEX, grad, 0.0)
    mine, column = own_columns(labels, col_offset, logits.shape[1])
    one_hot = torch.where(mine, scale, 0.0)
    for rows in _row_blocks(logits.shape[0]):
        g = torch.exp(logits[rows].float() - lse[rows, None]) * scale[rows, None]
        g.scatter_add_(1, column[rows, None], -one_hot[rows, None])
        logits[rows] = g.to(logits.dtype)


def own_columns(labels: torch.Tensor, col_offset: int, n_cols: int):
    """Which rows' labels fall among these columns, and each label's column (0 where not)."""
    column = labels - col_offset
    mine = (labels != IGNORE_INDEX) & (column >= 0) & (column < n_cols)
    return mine, torch.where(mine, column, 0)


def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


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
    from torchtitan.kernels import cross_entropy_kernels

    return cross_entropy_kernels
