"""The training loss: summed token cross-entropy (the trainer divides by the step's tokens)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.distributed.tensor.parallel import loss_parallel


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits (bs, seqlen, vocab), labels (bs, seqlen) -> summed loss in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")


def loss_context(vocab_sharded_logits: bool):
    """Forward loss and backward must both run inside this when the logits are vocab-sharded
    DTensors (TP loss parallel): the softmax then reduces across TP ranks instead of gathering."""
    return loss_parallel() if vocab_sharded_logits else contextlib.nullcontext()
