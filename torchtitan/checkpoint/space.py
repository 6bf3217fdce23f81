"""Disk space for checkpoints: the size of one, whether the folder holds what a run will keep,
and the one line a save that ran out of space ends with.

A full checkpoint holds every parameter in fp32 and AdamW's two fp32 moments: about 12 bytes a
parameter (``checkpoint_bytes``). ``space_warning`` (preflight) counts the saves a run makes and
how many ``keep_latest_k`` keeps at once (one more while a save is written, before the oldest
is deleted); ``save_failure`` (the manager, after a failed write) says whether it was space.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torchtitan.checkpoint.errors import CheckpointError
from torchtitan.checkpoint.folders import complete_steps

GIB = 1 << 30
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# Less than this left after a failed write: the disk was full, whatever the error said (torch's
# zip writer reports a short write as "unexpected pos ...").
NEARLY_FULL_BYTES = 64 << 20


def checkpoint_bytes(num_params: int, model_only: bool = False) -> int:
    """About one checkpoint: fp32 weights (4 bytes a parameter), plus AdamW's two fp32 moments
    unless ``model_only``; the step counters and the small states are left out."""
    return num_params * (4 if model_only else 12)


def gib(n: int) -> str:
    """``n`` bytes in GiB, or in MiB below 1 GiB."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


def existing_ancestor(path: Path) -> Path:
    """``path``, or its nearest parent that exists."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Free space (for an unprivileged user) on the filesystem that holds or will hold ``path``."""
    return shutil.disk_usage(existing_ancestor(path)).free


def folder_bytes(path: Path) -> int:
    """The bytes of the files under ``path`` (0 if it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # deleted meanwhile
                pass
    return total


# ----------------------------------------------------------------------------- before training


def count_saves(start: int, steps: int, interval: int) -> int:
    """Saves of a run that trains steps ``start + 1 .. steps``: every ``interval``, and the last."""
    if start >= steps:
        return 0
    return steps // interval - start // interval + (1 if steps % interval else 0)


def nth_save(start: int, steps: int, interval: int, n: int) -> int:
    """The step of the ``n``-th save (from 1) of that run."""
    return min((start // interval + n) * interval, steps)


@dataclass(frozen=True)
class SpacePlan:
    """What one run will write into a checkpoint folder."""

    folder: Path
    size: int  # bytes of one checkpoint
    start: int  # the step the run resumes after
    steps: int  # training.steps
    interval: int
    keep: int  # keep_latest_k, 0 = all


def space_warning(plan: SpacePlan) -> str | None:
    """A warning line when the folder's disk cannot hold what the run keeps (None when it can);
    ``CheckpointError`` when not even the first save fits."""
    saves = count_saves(plan.start, plan.steps, plan.interval)
    if not saves:
        return None
    free, size, keep = free_bytes(plan.folder), plan.size, plan.keep
    # Complete steps up to the one resumed, each taken as one checkpoint (every rank runs this:
    # no folder is walked); later ones are moved aside, not deleted.
    earlier = sum(1 for s in complete_steps(plan.folder) if 0 < s <= plan.start)
    deleted_first = max(earlier - keep, 0) if keep else 0  # beyond the newest k: before saving
    keep_that_fits = free // size + earlier - 1  # k + 1 on disk while saving
    if free + deleted_first * size < size:
        raise CheckpointError(
            f"{plan.folder} has {gib(free)} free on its disk, but one checkpoint of this model "
            f"and optimizer needs about {gib(size)}; "
            f"{_advice(keep, keep_that_fits, more_saves=False)}"
        )
    kept_earlier = min(earlier, keep)  # with k, replaced by the new steps in time
    fits = free // size + (earlier if keep else 0)  # checkpoints on disk at once
    most = min(kept_earlier + saves, keep + 1) if keep else saves  # on disk at once, at most
    if most <= fits:
        return None
    fails_at = nth_save(plan.start, plan.steps, plan.interval, fits - kept_earlier + 1)
    kept = f"keeps {keep} (one more while saving)" if keep else "keeps every one"
    return (
        f"checkpoints will fill the disk: {plan.folder} has {gib(free)} free, this run saves "
        f"{saves} checkpoint(s) of about {gib(size)} and {kept}, so the save at step {fails_at} "
        f"would fail; {_advice(keep, keep_that_fits)}"
    )


def _advice(keep: int, keep_that_fits: int, more_saves: bool = True) -> str:
    """What to change: a keep_latest_k that fits (it needs one copy more while saving), fewer
    saves (where a later save is the one that fails), a disk with more room."""
    ways = []
    if keep_that_fits >= 1 and (keep == 0 or keep_that_fits < keep):
        ways.append(f"set --checkpoint.keep_latest_k {keep_that_fits}")
    if keep == 0 and more_saves:
        ways.append("raise --checkpoint.interval")
    ways.append("free space, or set --job.dump_folder to a larger disk")
    return ", ".join(ways)


# ----------------------------------------------------------------------------- a failed save


def out_of_space(error: BaseException) -> bool:
    """Whether ``error`` (or an error it wraps: DCP's per-rank failures, causes) is a full disk
    or an exceeded quota."""
    seen: set[int] = set()
    stack = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL_DISK_ERRNOS:
            return True
        if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
            return True
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            stack += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        stack += [e.__cause__, e.__context__]
    return False


@dataclass(frozen=True)
class FailedSave:
    """A save that failed, as rank 0 found its folder (the partial ``.tmp`` already removed)."""

    step: int
    error: str  # the lowest failing rank's one-line description
    out_of_space: bool  # a rank's error said so
    written: int  # bytes of the partial folder, now removed
    free: int  # free bytes after removing it
    needed: int  # about one checkpoint: the newest complete step's size, else an estimate
    kept: int  # bytes of the complete steps (but the seed) in the folder
    previous: int | None  # the newest complete step, intact
    keep: int  # keep_latest_k


def discard_failed_save(
    tmp: Path, step: int, error: str, out_of_space: bool, estimate: int, keep: int
) -> FailedSave:
    """Remove the partial folder ``tmp`` of a failed save and describe what is left."""
    folder = tmp.parent
    written = folder_bytes(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    steps = [s for s in complete_steps(folder) if s]
    sizes = [folder_bytes(folder / f"step-{s}") for s in steps]
    return FailedSave(
        step=step,
        error=error,
        out_of_space=out_of_space,
        written=written,
        free=free_bytes(folder),
        needed=sizes[0] if sizes and sizes[0] else estimate,
        kept=sum(sizes),
        previous=steps[0] if steps else None,
        keep=keep,
    )


def save_failure(failed: FailedSave, folder: Path) -> str:
    """The one line a failed save ends the run with."""
    intact = f"step-{failed.previous} is intact" if failed.previous else "no earlier step exists"
    before = failed.free - failed.written  # free when the write failed
    full = failed.out_of_space or before < max(failed.needed - failed.written, NEARLY_FULL_BYTES)
    if not full:
        return (
            f"checkpoint step-{failed.step} could not be written: {failed.error}; its partial "
            f"folder was removed, {intact}"
        )
    keep_that_fits = (failed.free + failed.kept) // max(failed.needed, 1) - 1
    return (
        f"checkpoint step-{failed.step} could not be written: the disk of {folder} is full "
        f"({gib(failed.free)} free once its partial folder was removed; one checkpoint needs "
        f"about {gib(failed.needed)}); {intact}; {_advice(failed.keep, keep_that_fits)}"
    )


def state_bytes(model: Any, optimizer: Any = None) -> int:
    """The bytes of the parameters of ``model`` (a ``ModelState``) and the tensors of
    ``optimizer`` (an ``OptimizerState``): global sizes for DTensors; a pipeline rank counts
    only its own stages."""
    tensors = [p for part in model.parts for p in part.parameters()]
    for opt in optimizer.optimizers if optimizer is not None else []:
        tensors += [v for state in opt.state.values() for v in state.values()]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
