"""From a loader batch to what this rank's model is called with.

Training and validation both run ``with batch_inputs(*batch) as (inputs, labels, kwargs)`` around
forward + loss (+ backward): under context parallelism ``inputs`` and ``labels`` are this rank's
share of the sequence, and ``kwargs`` hold what the model's attention needs beyond the tokens
(document positions; a ``SequenceShard`` under context parallelism).

Two context-parallel paths: plain causal SDPA runs PyTorch's ring attention (``cp_context``,
which shards the tensors in place and restores them on exit); every other attention (document
masks, FlexAttention, per-document RoPE) shards here and all-gathers keys and values inside
attention (``context_parallel_documents.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from torchtitan.models.common.masks import AttentionOptions
from torchtitan.parallel.context_parallel import cp_context
from torchtitan.parallel.context_parallel_documents import sequence_shard, shard_sequence
from torchtitan.parallel.dims import ParallelDims

Inputs = tuple[torch.Tensor, torch.Tensor, dict]


class BatchInputs:
    """Callable as ``batch_inputs(inputs, labels, positions)`` -> a context of ``Inputs``."""

    def __init__(
        self,
        options: AttentionOptions,
        dims: ParallelDims,
        model_parts: list[nn.Module],
        rotate_method: str,
    ):
        self.options, self.dims = options, dims
        self.model_parts, self.rotate_method = model_parts, rotate_method

    @contextlib.contextmanager
    def __call__(
        self, inputs: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor
    ) -> Iterator[Inputs]:
        kwargs = {"positions": positions} if self.options.needs_positions else {}
        if self.dims.cp == 1:
            yield inputs, labels, kwargs
        elif not self.options.needs_positions:
            with self._ring_attention(inputs, labels):
                yield inputs, labels, kwargs
        else:
            shard = sequence_shard(self.dims.mesh("cp"), inputs.shape[1], inputs.device)
            kwargs["sequence_shard"] = shard
            yield shard_sequence(inputs, shard), shard_sequence(labels, shard), kwargs

    def _ring_attention(self, inputs: torch.Tensor, labels: torch.Tensor):
        """PyTorch's CP: inputs, labels and the RoPE caches sharded in place on the sequence."""
        caches = [part.rope_cache for part in self.model_parts]
        return cp_context(
            self.dims.mesh("cp"),
            [inputs, labels, *caches],
            [1, 1, *[0] * len(caches)],
            rotate_method=self.rotate_method,
        )


def documents_in(positions: torch.Tensor) -> int:
    """Documents (or the pieces of them a sample holds) in a batch of document positions."""
    return int((positions == 0).sum())
