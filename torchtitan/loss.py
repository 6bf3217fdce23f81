"""The training loss: summed token cross-entropy of the logits (the trainer divides by the
step's tokens). ``build_summed_loss`` is the one place the loss is chosen.

* ``in_place`` (``torchtitan.kernels.inplace_loss``): the backward writes the logits' gradient
  over the logits, so one logits-sized tensor exists at the step's peak instead of two (with Llama
  3's 128,256-entry vocabulary, 2 GiB per 8,192 tokens in bf16). The default on CUDA.
* ``standard``: ``F.cross_entropy`` (compiled with ``--compile.loss``).

Under TP's loss parallel the logits arrive sharded over the vocabulary; both losses then reduce
their softmax statistics across the TP group instead of gathering the logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.distributed.tensor.parallel import loss_parallel

from torchtitan.kernels.inplace_loss import in_place_chosen, inplace_cross_entropy_sum

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits (bs, seqlen, vocab), labels (bs, seqlen) -> summed loss in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


def loss_context(vocab_sharded_logits: bool):
    """Forward loss and backward must both run inside this when the logits are vocab-sharded
    DTensors (TP loss parallel): the softmax then reduces across TP ranks instead of gathering."""
    return loss_parallel() if vocab_sharded_logits else contextlib.nullcontext()


def build_summed_loss(logits_loss: str, compiled: bool, cuda: bool) -> LossFn:
    """The summed loss ``--training.logits_loss`` (auto, in_place, standard) asks for; the
    standard loss is compiled with ``compiled`` (``--compile.enable`` and ``--compile.loss``)."""
    if in_place_chosen(logits_loss, cuda):
        return inplace_cross_entropy_sum
    return torch.compile(cross_entropy_sum) if compiled else cross_entropy_sum


def per_step_loss(summed_loss: LossFn, step_tokens: int) -> LossFn:
    """A micro-batch's summed loss over the tokens of the whole optimizer step: the micro-batch
    (and pipeline microbatch) losses then add up to the step's mean loss, and their gradients to
    those of one large batch."""

    def step_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return summed_loss(logits, labels) / step_tokens

    return step_loss
