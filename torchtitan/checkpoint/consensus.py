"""Collective decisions: every rank takes the same branch and raises the same one-line error.

A rank that raised alone would leave the others waiting in the next collective until the
timeout. So a check that one rank makes (rank 0 looks at the files) is broadcast, and a failure
that any rank may hit (its own shards) is all-gathered, before anyone acts on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from torchtitan.checkpoint.errors import CheckpointError, describe_error
from torchtitan.config import ConfigError


class Consensus:
    """The ranks of the default process group (or this process alone, when there is none)."""

    def __init__(self) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0

    def decide_on_rank0(
        self,
        decide: Callable[[], Any],
        raise_as: type[Exception] = CheckpointError,
        catch: tuple[type[Exception], ...] = (Exception,),
        verbatim: tuple[type[Exception], ...] = (ConfigError,),
    ) -> Any:
        """Run ``decide`` on rank 0 only; every rank returns its result or raises its error.

        An exception of a ``catch`` type becomes ``raise_as(message)`` on every rank; the message
        is the error's own for ``verbatim`` types (user errors, already one line), else its type
        and first line.
        """
        box: list[Any] = [None, None]
        if self.rank == 0:
            try:
                box[0] = decide()
            except catch as error:
                box[1] = str(error) if isinstance(error, verbatim) else describe_error(error)
        if self.distributed:
            dist.broadcast_object_list(box, src=0)
        if box[1] is not None:
            raise raise_as(box[1])
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order."""
        if not self.distributed:
            return [value]
        values: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(values, value)
        return values

    def first_error(self, error: str | None) -> str | None:
        """The lowest rank's error, on every rank (None when no rank had one)."""
        return next((e for e in self.gather(error) if e is not None), None)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()
