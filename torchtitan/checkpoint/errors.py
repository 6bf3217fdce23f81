"""The checkpoint error type and the one-line description of any exception a save or load hits."""

from __future__ import annotations

from torch.distributed.checkpoint.api import CheckpointException

from torchtitan.config import ConfigError


class CheckpointError(ConfigError):
    """A checkpoint that cannot be found, read or written; the message is one line."""


def describe_error(error: BaseException) -> str:
    """One line: the exception type and the first line of its message (DCP's per-rank ones)."""
    if isinstance(error, CheckpointException) and error.failures:
        rank, (inner, _) = next(iter(error.failures.items()))
        return f"rank {rank}: {describe_error(inner)}"
    lines = str(error).strip().splitlines()
    # torch.load's weights-only refusal leads with advice to load unsafely; the cause comes later.
    cause = [line.strip() for line in lines if "WeightsUnpickler error:" in line]
    lines = cause or lines
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
