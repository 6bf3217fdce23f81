"""The fused chunked head + loss under tensor parallelism: the head's weight is split over the
TP ranks by vocabulary rows, as loss parallel splits the logits, and the loss of each chunk of
tokens reduces its softmax statistics across the ranks (``torchtitan.loss``'s
``sharded_chunk_loss_and_grad``). No rank ever holds a chunk's logits for the whole vocabulary.

``VocabShardedHead`` is the TP style of such a head: it only shards the weight (Shard(0)); the
head's own forward (``ChunkedLossHead``) gathers the sequence-parallel input and returns a plain
scalar, so the usual ColwiseParallel input/output conversions do not apply.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ParallelStyle


@dataclass(frozen=True)
class VocabShard:
    """Where this rank's rows of the vocabulary begin (its local weight holds the next
    ``weight.shape[0]``), and the TP group that holds the rest."""

    start: int
    group: dist.ProcessGroup


class VocabShardedHead(ParallelStyle):
    """Shard a head's weight over the TP mesh by vocabulary rows; nothing else."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def shard_weight(name, mod, mesh):
            for param_name, param in list(mod.named_parameters(recurse=False)):
                sharded = nn.Parameter(distribute_tensor(param, mesh, [Shard(0)]))
                mod.register_parameter(param_name, sharded)

        return distribute_module(module, device_mesh, shard_weight)


def vocab_sharded_operands(
    h: torch.Tensor, weight: DTensor
) -> tuple[torch.Tensor, torch.Tensor, VocabShard]:
    """(hidden states of the whole sequence, this rank's weight rows, its vocabulary shard).

    ``h`` arrives sequence-sharded (SP) or already whole on every TP rank; each rank's gradient of
    the gathered ``h`` is only its vocabulary rows' share, so it flows back as ``Partial`` (summed,
    and scattered back to the sequence shards)."""
    mesh = weight.device_mesh
    if mesh.ndim != 1 or tuple(weight.placements) != (Shard(0),):
        raise ValueError(
            f"the fused loss under TP needs the head's weight sharded by vocabulary rows on the "
            f"TP mesh alone; got {weight.placements} on a {mesh.ndim}-D mesh"
        )
    if not isinstance(h, DTensor):
        h = DTensor.from_local(h, mesh, [Replicate()])
    whole = h.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
    start = first_owned_row(weight.shape[0], mesh.size(), mesh.get_local_rank())
    return whole, weight.to_local(), VocabShard(start, mesh.get_group())


def first_owned_row(num_rows: int, group_size: int, group_rank: int) -> int:
    """The first row of ``group_rank``'s ``Shard(0)`` slice (torch.chunk's split: ceil-sized
    chunks, the last ones shorter or empty)."""
    chunk = -(-num_rows // group_size)
    return min(num_rows, group_rank * chunk)
