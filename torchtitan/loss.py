"""The training loss: summed token cross-entropy (the trainer divides by the step's tokens).

Two ways to get it from the final hidden states ``h`` (tokens x dim) and the output head ``W``
(vocab x dim):

* ``cross_entropy_sum(head(h), labels)``: the head writes the whole logits tensor (tokens x vocab,
  bf16 on GPU) and autograd keeps it, plus a gradient of the same size, until the head's backward
  ran. With Llama 3's 128,256-entry vocabulary that is the largest activation of the step: 2 GiB
  per 8,192 tokens, twice.
* ``linear_cross_entropy_sum(h, W, labels, chunk_tokens)``: head and loss fused and computed
  ``chunk_tokens`` tokens at a time. The forward already computes the gradients with respect to
  ``h`` and ``W`` (the loss is a plain sum, so the upstream gradient is a scalar applied in
  backward); only one chunk of logits exists at a time, in exchange for ``W``'s gradient held in
  fp32 from the forward to the backward. Same FLOPs, no recomputation.
"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from torchtitan.inplace_loss import IGNORE_INDEX, inplace_cross_entropy_sum, own_columns
from torchtitan.parallel.vocab_parallel import VocabShard, vocab_sharded_operands


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits (bs, seqlen, vocab), labels (bs, seqlen) -> summed loss in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


def loss_context(vocab_sharded_logits: bool):
    """Forward loss and backward must both run inside this when the logits are vocab-sharded
    DTensors (TP loss parallel): the softmax then reduces across TP ranks instead of gathering."""
    return loss_parallel() if vocab_sharded_logits else contextlib.nullcontext()


def chunk_loss_and_grad(logits: torch.Tensor, labels: torch.Tensor):
    """(tokens, vocab) logits -> (summed fp32 loss, d loss / d logits in the logits' dtype)."""
    lf = logits.float()
    keep = labels != IGNORE_INDEX
    safe = torch.where(keep, labels, 0)
    lse = torch.logsumexp(lf, dim=-1)
    picked = lf.gather(1, safe[:, None]).squeeze(1)
    return _loss_and_grad(lf, _SoftmaxStats(lse, picked, keep, safe, keep), logits.dtype)


def sharded_chunk_loss_and_grad(logits: torch.Tensor, labels: torch.Tensor, shard: VocabShard):
    """``chunk_loss_and_grad`` of logits that hold only this TP rank's vocabulary columns
    ``[shard.start, shard.start + logits.shape[1])``: the softmax's max and sum, and each
    label's logit, are reduced across ``shard.group``. -> (the chunk's summed loss, the same on
    every rank; d loss / d these logits)."""
    lf = logits.float()
    return _loss_and_grad(lf, _sharded_softmax_stats(lf, labels, shard), logits.dtype)


def sharded_chunk_loss(logits: torch.Tensor, labels: torch.Tensor, shard: VocabShard):
    """The loss of ``sharded_chunk_loss_and_grad`` alone (validation: no gradient)."""
    s = _sharded_softmax_stats(logits.float(), labels, shard)
    return torch.where(s.keep, s.lse - s.picked, 0.0).sum()


class _SoftmaxStats(NamedTuple):
    lse: torch.Tensor  # per row: log-sum-exp over the whole vocabulary
    picked: torch.Tensor  # per row: the label's logit (0 where ignored)
    keep: torch.Tensor  # the rows whose label counts
    safe: torch.Tensor  # the label's column in these logits (0 where not in_columns)
    in_columns: torch.Tensor  # the rows whose label is among these logits' columns


def _sharded_softmax_stats(lf: torch.Tensor, labels: torch.Tensor, shard: VocabShard):
    keep = labels != IGNORE_INDEX
    mine, safe = own_columns(labels, shard.start, lf.shape[1])
    peak = lf.amax(dim=-1)
    dist.all_reduce(peak, dist.ReduceOp.MAX, group=shard.group)
    exp_sum = torch.exp(lf - peak[:, None]).sum(dim=-1)
    picked = torch.where(mine, lf.gather(1, safe[:, None]).squeeze(1), 0.0)
    sums = torch.stack([exp_sum, picked])
    dist.all_reduce(sums, group=shard.group)  # one collective for both sums
    return _SoftmaxStats(peak + torch.log(sums[0]), sums[1], keep, safe, mine)


def _loss_and_grad(lf: torch.Tensor, s: _SoftmaxStats, dtype: torch.dtype):
    """The chunk's summed loss and its gradient ``softmax - one_hot(label)`` (in ``dtype``)."""
    loss = torch.where(s.keep, s.lse - s.picked, 0.0).sum()
    grad = torch.exp(lf - s.lse[:, None])
    grad = grad.scatter_add(1, s.safe[:, None], -s.in_columns[:, None].to(grad.dtype))
    return loss, (grad * s.keep[:, None]).to(dtype)


@functools.cache
def _compiled_chunk_loss_and_grad():
    return torch.compile(chunk_loss_and_grad, dynamic=False)


def _chunk_fn(device: torch.device, shard: VocabShard | None):
    """The chunk's softmax and gradient: as fused GPU kernels for whole-vocabulary logits; eager
    on CPU and for vocabulary shards (whose collectives would split the compiled graph)."""
    if shard is not None:
        return functools.partial(sharded_chunk_loss_and_grad, shard=shard)
    return _compiled_chunk_loss_and_grad() if device.type == "cuda" else chunk_loss_and_grad


def _accumulate_weight_grad(acc: torch.Tensor, grad_logits: torch.Tensor, h: torch.Tensor):
    """acc (fp32, vocab x dim) += grad_logits^T @ h, accumulating in fp32."""
    if acc.dtype == grad_logits.dtype:
        acc.addmm_(grad_logits.t(), h)
    elif acc.is_cuda:
        acc.copy_(torch.addmm(acc, grad_logits.t(), h, out_dtype=acc.dtype))
    else:
        acc.add_(grad_logits.t() @ h)


class _LinearCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, chunk_tokens, shard):
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        chunk = _chunk_fn(h.device, shard)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(h) if want_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if want_w else None
        for start in range(0, h.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            loss, grad_logits = chunk(h[rows] @ weight.t(), labels[rows])
            total += loss
            if want_h:
                grad_h[rows] = grad_logits @ weight
            if want_w:
                _accumulate_weight_grad(grad_w, grad_logits, h[rows])
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        if grad_h is not None:
            grad_h = grad_h * grad_out.to(grad_h.dtype)
        if grad_w is not None:
            grad_w = (grad_w * grad_out).to(ctx.weight_dtype)
        return grad_h, grad_w, None, None, None


def linear_cross_entropy_sum(
    h: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_tokens: int,
    shard: VocabShard | None = None,
) -> torch.Tensor:
    """Summed cross-entropy of ``h @ weight.T`` against ``labels``, ``chunk_tokens`` at a time.

    h (..., dim), weight (vocab, dim), labels (...) -> fp32 scalar; equal to
    ``cross_entropy_sum(F.linear(h, weight), labels)`` and so are its gradients. With ``shard``,
    ``weight`` holds only this TP rank's vocabulary rows and the loss is the whole vocabulary's;
    the gradient of ``h`` is then this rank's share (the caller sums it across the ranks).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive; got {chunk_tokens}")
    if isinstance(weight, DTensor):
        raise ValueError(
            "the fused loss takes the head's weight as a local tensor, but got a DTensor "
            f"({weight.placements}); pass its vocabulary shard (vocab_sharded_operands)"
        )
    device = h.device.type
    if torch.is_autocast_enabled(device):  # what autocast would do to F.linear's inputs
        dtype = torch.get_autocast_dtype(device)
        h, weight = h.to(dtype), weight.to(dtype)
    h, labels = h.reshape(-1, h.shape[-1]), labels.reshape(-1)
    with torch.autocast(device, enabled=False):
        if not torch.is_grad_enabled():  # validation: no gradients to precompute
            return _chunked_loss_only(h, weight, labels, chunk_tokens, shard)
        return _LinearCrossEntropySum.apply(h, weight, labels, chunk_tokens, shard)


def _chunked_loss_only(h, weight, labels, chunk_tokens: int, shard) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float32, device=h.device)
    for start in range(0, h.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        logits = (h[rows] @ weight.t()).float()
        if shard is None:
            total += F.cross_entropy(logits, labels[rows], reduction="sum")
        else:
            total += sharded_chunk_loss(logits, labels[rows], shard)
    return total


class ChunkedLossHead(torch.nn.Linear):
    """An output head whose forward can also return the fused, chunked loss of its input.

    ``head(h)`` gives logits as any ``nn.Linear``; ``head(h, labels)`` gives the summed
    cross-entropy through ``linear_cross_entropy_sum``. The loss is computed inside the head's
    own call, so whatever wraps the head (FSDP's gather before forward and gradient reduction
    after backward) runs as for any forward.
    """

    chunk_tokens: int = 0

    def forward(self, h: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if labels is None:
            return super().forward(h)
        if isinstance(self.weight, DTensor):  # tensor parallel: VocabShardedHead
            h, weight, shard = vocab_sharded_operands(h, self.weight)
            return linear_cross_entropy_sum(h, weight, labels, self.chunk_tokens, shard)
        return linear_cross_entropy_sum(h, self.weight, labels, self.chunk_tokens)


def use_chunked_loss_head(model: torch.nn.Module, chunk_tokens: int) -> None:
    """Give ``model`` (a Llama, on the meta device, before any parallelism) a
    ``ChunkedLossHead`` in place of its ``output`` linear, and make its forward stop before the
    head (``defer_head``): the loss then calls the head with the labels."""
    linear = model.output
    head = ChunkedLossHead(
        linear.in_features, linear.out_features, bias=False, device=linear.weight.device
    )
    head.chunk_tokens = chunk_tokens
    model.output = head
    model.defer_head = True


class SummedLoss:
    """The trainer's summed token loss of the last pipeline stage's output: the cross-entropy
    of the logits, or, with ``chunk_tokens``, of the final hidden states through the parts'
    ``ChunkedLossHead`` (see ``use_chunked_loss_head``).

    ``in_place``: whole logits go through ``inplace_cross_entropy_sum`` (the gradient written
    over the logits) instead of ``F.cross_entropy`` (compiled with ``compiled``).
    ``autocast``: the context the fused head's matmuls run in (the model's own forward runs the
    head under the trainer's bf16 autocast on one GPU)."""

    def __init__(
        self,
        model_parts: list[torch.nn.Module],
        chunk_tokens: int = 0,
        compiled: bool = False,
        in_place: bool = False,
        autocast=contextlib.nullcontext,
    ):
        self.chunk_tokens = chunk_tokens
        self.autocast = autocast
        # Only the part holding the last stage has a head (and computes the loss).
        self.head = next((p.output for p in model_parts if p.output is not None), None)
        if in_place:
            self.logits_loss = inplace_cross_entropy_sum
        else:
            self.logits_loss = torch.compile(cross_entropy_sum) if compiled else cross_entropy_sum

    def __call__(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if not self.chunk_tokens:
            return self.logits_loss(output, labels)
        with self.autocast():
            return self.head(output, labels)
