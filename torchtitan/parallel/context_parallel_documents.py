"""Context parallelism for attention that PyTorch's ring attention cannot run: document masks,
FlexAttention, varlen and per-document RoPE positions.

Each CP rank keeps its share of the sequence for everything but attention; in attention it
all-gathers the keys and values of the whole sequence over the CP group and attends its own
queries to them under the mask of those queries' rows. The share: the sequence cut into
128-token chunks (FlexAttention's block), dealt to the ranks in snake order (0 .. cp-1, then
cp-1 .. 0, ...), so every rank holds queries from all over the sequence and the attention work
stays even however long the documents are (PyTorch's head-and-tail split evens out one causal
sequence, not several documents); a sequence that does not split into such chunks falls back to
that head-and-tail split. With grouped-query attention the keys and values are a
fraction of the queries' size (a quarter for Llama 3's 8 of 32 heads), and one kernel call sees
the whole mask, so FlexAttention skips every masked block. The gather's backward sums the key
and value gradients of all CP ranks (a reduce-scatter).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from torchtitan.models.common.masks import FLEX_BLOCK, document_block_mask, document_ids


def _chunks(seq_len: int, cp: int) -> int:
    """How many chunks the sequence is dealt in: 128-token ones where they split evenly in
    pairs of rounds, else 2 * cp (head and tail)."""
    if seq_len % (2 * cp * FLEX_BLOCK) == 0:
        return seq_len // FLEX_BLOCK
    return 2 * cp


def sequence_index(seq_len: int, cp_rank: int, cp: int, device=None) -> torch.Tensor:
    """The positions in the full sequence of a CP rank's tokens, in the order it holds them."""
    chunks = _chunks(seq_len, cp)
    size = seq_len // chunks
    mine = []
    for chunk in range(chunks):
        round_, seat = divmod(chunk, cp)
        if (seat if round_ % 2 == 0 else cp - 1 - seat) == cp_rank:
            mine.append(torch.arange(chunk * size, (chunk + 1) * size, device=device))
    return torch.cat(mine)


@dataclass(frozen=True)
class SequenceShard:
    """What a model needs to run on its CP rank's share of the sequence: the full-sequence index
    of each local token and a function that gathers a (batch, local seq, ...) tensor of every
    rank into the full sequence, in order (differentiable)."""

    index: torch.Tensor
    gather: Callable[[torch.Tensor], torch.Tensor]


def sequence_shard(cp_mesh: DeviceMesh, seq_len: int, device) -> SequenceShard:
    cp, rank = cp_mesh.size(), cp_mesh.get_local_rank()
    index = sequence_index(seq_len, rank, cp, device)
    gathered_order = torch.cat([sequence_index(seq_len, r, cp, device) for r in range(cp)])
    inverse = torch.argsort(gathered_order)

    def gather(local: torch.Tensor) -> torch.Tensor:
        sharded = DTensor.from_local(local, cp_mesh, [Shard(1)], run_check=False)
        # Partial gradients: each rank's gradient of the gathered tensor covers only its own
        # queries' use of it, so the backward sums them (reduce-scatter) instead of slicing.
        full = sharded.redistribute(cp_mesh, [Replicate()]).to_local(grad_placements=[Partial()])
        return full.index_select(1, inverse)  # from the ranks' order to the sequence's

    return SequenceShard(index, gather)


def shard_sequence(tensor: torch.Tensor, shard: SequenceShard) -> torch.Tensor:
    """This CP rank's share of a (batch, seq, ...) tensor."""
    return tensor.index_select(1, shard.index)


def computed_blocks_per_rank(positions: torch.Tensor, cp: int) -> list[int]:
    """FlexAttention blocks (128 x 128) each CP rank computes for a batch of document positions
    (batch, seq): the measure of how evenly the load-balanced split shares the work."""
    doc = document_ids(positions)
    counts = []
    for rank in range(cp):
        mask = document_block_mask(doc, sequence_index(doc.shape[1], rank, cp, doc.device))
        counts.append(int(mask.kv_num_blocks.sum() + mask.full_kv_num_blocks.sum()))
    return counts
