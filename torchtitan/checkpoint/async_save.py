"""Asynchronous saves: the state is staged in host memory, then written by a background thread.

At most one save is in flight. ``finish`` waits for it and reports this rank's failure; the
caller checks with every rank that it succeeded and only then renames its folder into place, so
a step is never visible under its final name before its write has completed.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from torchtitan.checkpoint.consensus import Consensus
from torchtitan.checkpoint.errors import describe_error
from torchtitan.checkpoint.space import out_of_space

try:  # torch >= 2.9: staging into (pinned) CPU buffers that are reused across saves
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
except ImportError:  # pragma: no cover
    DefaultStager = StagingOptions = None

logger = logging.getLogger("torchtitan")


@dataclass
class PendingSave:
    """An asynchronous save whose background write may still be running."""

    step: int
    upload: Future
    staging: Future | None
    started: float
    blocked: float
    stager: Any = None  # the pinned-memory stager of this save, closed when it is finished
    done_at: float | None = None
    failure: tuple[str, bool] | None = None  # this rank's (one-line error, out of space)


def _pinned_stager():
    """Stages into pinned host memory in a background thread with non-blocking copies (CUDA)."""
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=True,
            use_shared_memory=False,
            use_async_staging=True,
            use_non_blocking_copy=True,
        )
    )


class AsyncSaver:
    """``dcp.async_save`` in mode ``async`` or ``async_with_pinned_mem``; construct on every rank.

    Pinned mode needs CUDA and torch >= 2.9; without them it warns and uses ``async``.
    """

    def __init__(
        self, mode: str, optimizers: list[torch.optim.Optimizer], consensus: Consensus
    ) -> None:
        self.mode = mode
        self._consensus = consensus
        self._pinned = False
        self._group = None
        self._hooks: list = []
        self._pending: PendingSave | None = None
        if mode == "async_with_pinned_mem":
            if not torch.cuda.is_available() or DefaultStager is None:
                logger.warning(
                    "checkpoint.async_mode=async_with_pinned_mem needs CUDA (pinned host memory) "
                    "and torch >= 2.9; using async_mode=async"
                )
                self.mode = "async"
            else:
                # Staging (device -> pinned host copy) runs in a thread, overlapping the next
                # step's forward and backward; the next optimizer step waits for it (pre-hook).
                self._pinned = True
                for optimizer in optimizers:
                    hook = optimizer.register_step_pre_hook(self._before_optimizer_step)
                    self._hooks.append(hook)
        if consensus.distributed:
            # The background write's collectives get a gloo group of their own: they must not
            # interleave with the training's collectives, and async_save needs a CPU backend.
            self._group = dist.new_group(backend="gloo")

    def start(self, step: int, state: dict[str, Any], checkpoint_id: Path, started: float) -> None:
        """Stage ``state`` and write it to ``checkpoint_id`` in the background."""
        # One stager per save: torch 2.11's DefaultStager is single-use (it clears its own
        # tables after staging), so its pinned buffers cannot be reused across saves anyway.
        stager = _pinned_stager() if self._pinned else None
        extra = {} if stager is None else {"async_stager": stager}
        result = dcp.async_save(
            state,
            checkpoint_id=str(checkpoint_id),
            process_group=self._group,
            no_dist=not self._consensus.distributed,
            **extra,
        )
        upload = getattr(result, "upload_completion", result)
        staging = getattr(result, "staging_completion", None)
        pending = PendingSave(step, upload, staging, started, 0.0, stager)

        def done(_future, pending=pending):
            pending.done_at = time.perf_counter()

        upload.add_done_callback(done)
        pending.blocked = time.perf_counter() - started
        self._pending = pending
        logger.info(
            "checkpoint step-%d: blocked %.2fs, writing to %s in the background",
            step,
            pending.blocked,
            checkpoint_id,
        )

    def wait_for_staging(self) -> None:
        """Wait until the pending save has copied the state out (pinned-memory mode)."""
        pending = self._pending
        if pending is not None and pending.staging is not None:
            start = time.perf_counter()
            pending.staging.result()
            pending.staging = None
            pending.blocked += time.perf_counter() - start

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.wait_for_staging()

    def finish(self) -> PendingSave | None:
        """Wait for the pending save (None if there is none); its ``failure`` is this rank's
        error, if its write failed (the caller agrees on it with the other ranks)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            if pending.staging is not None:
                pending.staging.result()
            pending.upload.result()
        except (Exception, CheckpointException) as e:
            pending.failure = (describe_error(e), out_of_space(e))
        finally:
            if pending.stager is not None:
                pending.stager.close()  # frees (unpins) its buffers
        return pending

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
