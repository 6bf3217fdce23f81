"""Which vocabulary rows a rank holds when a table (logits' columns, an embedding's rows) is split
over a process group as ``Shard`` places it."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class VocabShard:
    """Where this rank's rows of the vocabulary begin (its local slice holds the next ones), and
    the group that holds the rest."""

    start: int
    group: dist.ProcessGroup


def first_owned_row(num_rows: int, group_size: int, group_rank: int) -> int:
    """The first row of ``group_rank``'s ``Shard(0)`` slice (torch.chunk's split: ceil-sized
    chunks, the last ones shorter or empty)."""
    chunk = -(-num_rows // group_size)
    return min(num_rows, group_rank * chunk)
