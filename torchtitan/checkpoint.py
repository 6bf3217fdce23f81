"""Checkpoints through torch.distributed.checkpoint (DCP): save, resume, seed, export.

``CheckpointManager`` saves the model parts, their optimizers and LR schedulers, the data loader
and a ``TrainState`` to ``<dump_folder>/<folder>/step-<N>/`` and resumes from the latest complete
step. Model and optimizer states are keyed by parameter FQN (the optimizer's too, through
``flatten_optimizer_state_dict``), so a checkpoint written under one FSDP/TP/PP layout loads into
any other: DCP reshards on load. docs/checkpointing.md describes the layout, the rules and the API.

Atomicity: a step is written to ``step-<N>.tmp``; only when every rank has finished does rank 0
rename it to ``step-<N>``. A folder without DCP's ``.metadata`` file, or with a suffix, is never
loaded. When the latest step fails to load, the previous complete one is tried.

Nothing is unpickled with arbitrary classes: DCP's ``.metadata`` is read with an unpickler that only
knows DCP's metadata types, and the non-tensor values with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import collections
import copy
import importlib
import io
import logging
import pathlib
import pickle
import re
import shutil
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from torchtitan.config import Checkpoint, ConfigError
from torchtitan.parallel.float8 import plain_weights

try:  # torch >= 2.9: staging into (pinned) CPU buffers that are reused across saves
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
except ImportError:  # pragma: no cover
    DefaultStager = StagingOptions = None

logger = logging.getLogger("torchtitan")

# DCP warns on every single-process save/load, even when asked for one (no_dist=True).
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninit")

STATES = ("model", "optimizer", "lr_scheduler", "dataloader", "train_state")
# Identical on every rank by design, so rank 0 alone writes them (one copy, rank-independent).
GLOBAL_STATES = ("lr_scheduler", "dataloader", "train_state")
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Optimizer param_group entries that describe the implementation, not the training state: the
# resuming run's own choice wins (a CPU run's foreach checkpoint must not turn off fused on GPU).
IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")

STEP_RE = re.compile(r"^step-(\d+)$")
TRANSIENT_RE = re.compile(r"^step-\d+(\.[a-z]+)?\.tmp$")  # ours: in progress or being deleted
FLAT_OPTIM = StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointError(ConfigError):
    """A checkpoint that cannot be found, read or written; the message is one line."""


# --------------------------------------------------------------------------- safe reading


def _allowed_global(module: str, name: str):
    """The object a DCP ``.metadata`` pickle may refer to, or None."""
    if "." in name:
        return None
    if module == "torch.distributed.checkpoint.metadata":
        obj = getattr(importlib.import_module(module), name, None)
        return obj if isinstance(obj, type) and obj.__module__ == module else None
    if (module, name) == ("torch.distributed.checkpoint.filesystem", "_StorageInfo"):
        return getattr(importlib.import_module(module), name)
    if (module, name) == ("torch.serialization", "_get_layout"):
        return torch.serialization._get_layout
    if module == "torch":
        obj = getattr(torch, name, None)
        if name == "Size" or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
            return obj
        return None
    if module in ("pathlib", "pathlib._local") and name in (
        "Path",
        "PosixPath",
        "WindowsPath",
        "PurePath",
        "PurePosixPath",
        "PureWindowsPath",
    ):
        return getattr(pathlib, name)
    if (module, name) == ("collections", "OrderedDict"):
        return collections.OrderedDict
    return None


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        obj = _allowed_global(module, name)
        if obj is None:
            raise pickle.UnpicklingError(
                f"checkpoint metadata refers to {module}.{name}, which is not a DCP metadata type"
            )
        return obj


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` unpickling only accepts DCP's metadata types."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = getattr(self, "load_id", None)
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose non-tensor values must pass ``torch.load(weights_only=True)``.

    DCP's own ``load_bytes`` unpickles with ``weights_only=False``. Every value is first loaded
    with ``weights_only=True`` (which refuses any pickle that names a non-allowlisted global) and
    only then handed to the parent, which stores it where it belongs in the state dict.
    """

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        torch.load(value, weights_only=True)
        value.seek(0)
        super().load_bytes(read_item, value)


def read_state_names(path: str | Path) -> set[str]:
    """Top-level states a DCP checkpoint holds ("model", "optimizer", ...), from its metadata."""
    metadata = SafeFileSystemReader(str(path)).read_metadata()
    return {key.split(".", 1)[0] for key in metadata.state_dict_metadata}


# --------------------------------------------------------------------------- the saved states


@dataclass
class TrainState(Stateful):
    """The train loop's own progress: the last completed step and what it has consumed."""

    step: int = 0
    tokens_seen: int = 0  # global tokens trained on, over all data-parallel ranks

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "tokens_seen": self.tokens_seen}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.step = int(state_dict["step"])
        self.tokens_seen = int(state_dict.get("tokens_seen", 0))


class ModelState(Stateful):
    """Every model part's parameters and buffers, by FQN (clean: no compile/AC wrapper names)."""

    def __init__(self, parts: list[nn.Module]):
        self.parts = parts
        self._keys: list[list[str]] | None = None

    def state_dict(self) -> dict[str, Any]:
        merged, self._keys = {}, []
        for part in self.parts:
            state = plain_weights(get_model_state_dict(part))  # no float8 wrapper saved
            self._keys.append(list(state))
            merged.update(state)
        return merged

    def export_state_dict(self, dtype: torch.dtype) -> dict[str, Any]:
        state = self.state_dict()
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._keys is None:
            self.state_dict()
        for part, keys in zip(self.parts, self._keys):
            set_model_state_dict(part, {k: state_dict[k] for k in keys})


class OptimizerState(Stateful):
    """Each part's optimizer state, flattened to FQN keys (``state.<fqn>.exp_avg``, ...)."""

    def __init__(self, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]):
        self.parts = parts
        self.optimizers = optimizers
        self._keys: list[list[str]] | None = None
        self._implementation: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        merged, self._keys = {}, []
        for part, optimizer in zip(self.parts, self.optimizers):
            state = get_optimizer_state_dict(part, optimizer, options=FLAT_OPTIM)
            self._keys.append(list(state))
            merged.update(state)
        self._implementation = {
            k: v
            for k, v in merged.items()
            if k.startswith("param_groups.") and k.rsplit(".", 1)[1] in IMPLEMENTATION_FLAGS
        }
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._keys is None:
            self.state_dict()
        state_dict = {**state_dict, **self._implementation}
        for part, optimizer, keys in zip(self.parts, self.optimizers, self._keys):
            part_state = {k: state_dict[k] for k in keys}
            set_optimizer_state_dict(part, optimizer, part_state, options=FLAT_OPTIM)


class _BlobState(Stateful):
    """A small Python state kept as one opaque blob (``torch.save`` bytes).

    DCP would flatten a nested dict into one entry per leaf, and loading needs a template with
    the same leaves; a data loader's state can change shape as it runs (a streaming dataset's
    cursor), so it travels whole. Read back with ``torch.load(weights_only=True)``.
    """

    def __init__(self, get_state, set_state):
        self._get_state = get_state
        self._set_state = set_state

    def state_dict(self) -> dict[str, bytes]:
        buffer = io.BytesIO()
        torch.save(self._get_state(), buffer)
        return {"blob": buffer.getvalue()}

    def load_state_dict(self, state_dict: dict[str, bytes]) -> None:
        self._set_state(torch.load(io.BytesIO(state_dict["blob"]), weights_only=True))


class LRSchedulerState(_BlobState):
    """The schedulers step in lockstep, so one state (the first's) is saved and loaded into all.

    After loading, each optimizer's lr is set to its scheduler's last lr, so the next step uses
    the resumed lr even when the optimizer state itself is excluded from loading.
    """

    def __init__(self, schedulers: list):
        self.schedulers = schedulers
        super().__init__(lambda: schedulers[0].state_dict(), self._set)

    def _set(self, state: dict[str, Any]) -> None:
        for scheduler in self.schedulers:
            scheduler.load_state_dict(copy.deepcopy(state))
        for scheduler in self.schedulers:
            for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr()):
                group["lr"] = lr


# --------------------------------------------------------------------------- the manager


@dataclass
class _PendingSave:
    """An asynchronous save whose background write may still be running."""

    step: int
    tmp: Path
    final: Path
    upload: Future
    staging: Future | None
    started: float
    blocked: float
    stager: Any = None  # the pinned-memory stager of this save, closed when it is finished
    done_at: float | None = None


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


def _describe(error: BaseException) -> str:
    """One line: the exception type and the first line of its message (DCP's per-rank ones)."""
    if isinstance(error, CheckpointException) and error.failures:
        rank, (inner, _) = next(iter(error.failures.items()))
        return f"rank {rank}: {_describe(inner)}"
    lines = str(error).strip().splitlines()
    # torch.load's weights-only refusal leads with advice to load unsafely; the cause comes later.
    cause = [line.strip() for line in lines if "WeightsUnpickler error:" in line]
    lines = cause or lines
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _as_list(things) -> list:
    """None -> [], one object -> [it], a list or tuple -> a list."""
    if things is None:
        return []
    return list(things) if isinstance(things, list | tuple) else [things]


def _listing(steps: list[int]) -> str:
    return ", ".join(str(s) for s in sorted(steps)) or "none"


def is_complete(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").is_file()


def complete_steps(folder: Path) -> list[int]:
    """Steps with a complete ``step-<N>`` folder (DCP ``.metadata`` present), newest first."""
    if not folder.is_dir():
        return []
    steps = []
    for child in folder.iterdir():
        match = STEP_RE.match(child.name)
        if match and is_complete(child):
            steps.append(int(match.group(1)))
    return sorted(steps, reverse=True)


def _incomplete_folders(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(
        c.name
        for c in folder.iterdir()
        if c.name.startswith("step-") and not (STEP_RE.match(c.name) and is_complete(c))
    )


class CheckpointManager:
    """Saves and resumes everything a training run needs; see the module doc.

    ``model_parts``: the modules this rank holds (several pipeline stages possibly; FQNs must be
    unique across them). ``optimizers`` and ``lr_schedulers``: one per part (or none).
    ``dataloader``: a StatefulDataLoader whose state is identical on every rank (rank 0's is
    saved). ``train_state``: the loop's ``TrainState``; one is created when omitted.
    """

    def __init__(
        self,
        cfg: Checkpoint,
        dump_folder: str | Path,
        *,
        model_parts: nn.Module | list[nn.Module],
        optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] = (),
        lr_schedulers: Any = (),
        dataloader: Any = None,
        train_state: TrainState | None = None,
    ):
        self.cfg = cfg
        self.folder = Path(dump_folder) / cfg.folder
        parts = _as_list(model_parts)
        optimizers = _as_list(optimizers)
        lr_schedulers = _as_list(lr_schedulers)
        if optimizers and len(optimizers) != len(parts):
            raise ValueError(f"{len(optimizers)} optimizers for {len(parts)} model parts")
        if lr_schedulers and len(lr_schedulers) != len(optimizers):
            raise ValueError(f"{len(lr_schedulers)} lr schedulers for {len(optimizers)} optimizers")
        self.train_state = train_state if train_state is not None else TrainState()
        self.states: dict[str, Stateful] = {"model": ModelState(parts)}
        if optimizers:
            self.states["optimizer"] = OptimizerState(parts, optimizers)
        if lr_schedulers:
            self.states["lr_scheduler"] = LRSchedulerState(lr_schedulers)
        if dataloader is not None:
            self.states["dataloader"] = _BlobState(
                dataloader.state_dict, dataloader.load_state_dict
            )
        self.states["train_state"] = _BlobState(
            self.train_state.state_dict, self.train_state.load_state_dict
        )
        self._distributed = dist.is_available() and dist.is_initialized()
        self._rank = dist.get_rank() if self._distributed else 0
        self._pending: _PendingSave | None = None
        self._pinned = False
        self._async_group = None
        self._hooks: list = []
        self._purger: ThreadPoolExecutor | None = None
        self._cleaned_transient = False
        self._closed = False
        self.resumed = False  # set by load() when it restored a step from the folder
        self.async_mode = cfg.async_mode if cfg.enable else "disabled"
        if self.async_mode != "disabled":
            self._set_up_async(optimizers)

    def _set_up_async(self, optimizers: list[torch.optim.Optimizer]) -> None:
        if self.async_mode == "async_with_pinned_mem":
            if not torch.cuda.is_available() or DefaultStager is None:
                logger.warning(
                    "checkpoint.async_mode=async_with_pinned_mem needs CUDA (pinned host memory) "
                    "and torch >= 2.9; using async_mode=async"
                )
                self.async_mode = "async"
            else:
                # Staging (device -> pinned host copy) runs in a thread, overlapping the next
                # step's forward and backward; the next optimizer step waits for it (pre-hook).
                self._pinned = True
                for optimizer in optimizers:
                    hook = optimizer.register_step_pre_hook(self._before_optimizer_step)
                    self._hooks.append(hook)
        if self._distributed:
            # The background write's collectives get a gloo group of their own: they must not
            # interleave with the training's collectives, and async_save needs a CPU backend.
            self._async_group = dist.new_group(backend="gloo")

    # ----------------------------------------------------------------------- collectives

    def _barrier(self) -> None:
        if self._distributed:
            dist.barrier()

    def _on_rank0(self, fn) -> Any:
        """Run ``fn`` on rank 0 only; every rank gets its result or raises its error."""
        box: list[Any] = [None, None]
        if self._rank == 0:
            try:
                box[0] = fn()
            except Exception as error:  # every rank must learn of it, or the others would hang
                box[1] = str(error) if isinstance(error, ConfigError) else _describe(error)
        if self._distributed:
            dist.broadcast_object_list(box, src=0)
        if box[1] is not None:
            raise CheckpointError(box[1])
        return box[0]

    def _agree(self, error: str | None) -> str | None:
        """The first rank's error, on every rank (so all ranks take the same branch)."""
        if not self._distributed:
            return error
        errors: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        return next((e for e in errors if e is not None), None)

    # ----------------------------------------------------------------------- saving

    def should_save(self, step: int, last_step: bool = False, force: bool = False) -> bool:
        """Due every ``interval`` steps, at the last step and when forced (e.g. on SIGTERM);
        never at step 0 (the seed's)."""
        due = last_step or force or step % self.cfg.interval == 0
        return self.cfg.enable and step > 0 and due

    def save(self, step: int, last_step: bool = False, force: bool = False) -> bool:
        """Save ``step`` if it is due (every ``interval`` steps, and the last); True if it was.

        Synchronous unless async_mode is on (the last step is always synchronous): then it
        returns once the state is staged in host memory and the write runs in the background;
        the next ``save`` or ``close`` finishes it (waits, then renames ``.tmp`` to the final
        name). Call it on every rank.
        """
        if not self.should_save(step, last_step, force):
            return False
        start = time.perf_counter()
        self._finish_pending()
        model_only = last_step and self.cfg.last_save_model_only
        if model_only:
            dtype = EXPORT_DTYPES[self.cfg.export_dtype]
            state: dict[str, Any] = {"model": self.states["model"].export_state_dict(dtype)}
        else:
            state = {
                k: v for k, v in self.states.items() if k not in GLOBAL_STATES or self._rank == 0
            }
        final = self.folder / f"step-{step}"
        tmp = final.with_name(final.name + ".tmp")
        self._on_rank0(lambda: self._prepare(tmp))
        if self.async_mode != "disabled" and not last_step and not force:
            self._start_async(step, state, tmp, final, start)
            return True
        error = None
        try:
            dcp.save(state, checkpoint_id=str(tmp), no_dist=not self._distributed)
        except (Exception, CheckpointException) as e:
            error = _describe(e)
        error = self._agree(error)
        if error is not None:
            raise CheckpointError(f"checkpoint step-{step} could not be written: {error}")
        self._commit(final, tmp)
        what = f"model weights only, {self.cfg.export_dtype}" if model_only else "full state"
        logger.info(
            "checkpoint step-%d (%s) saved to %s: blocked %.2fs",
            step,
            what,
            final,
            time.perf_counter() - start,
        )
        return True

    def _start_async(
        self, step: int, state: dict[str, Any], tmp: Path, final: Path, start: float
    ) -> None:
        # One stager per save: torch 2.11's DefaultStager is single-use (it clears its own
        # tables after staging), so its pinned buffers cannot be reused across saves anyway.
        stager = _pinned_stager() if self._pinned else None
        extra = {} if stager is None else {"async_stager": stager}
        result = dcp.async_save(
            state,
            checkpoint_id=str(tmp),
            process_group=self._async_group,
            no_dist=not self._distributed,
            **extra,
        )
        upload = getattr(result, "upload_completion", result)
        staging = getattr(result, "staging_completion", None)
        pending = _PendingSave(step, tmp, final, upload, staging, start, 0.0, stager)

        def done(_future, pending=pending):
            pending.done_at = time.perf_counter()

        upload.add_done_callback(done)
        pending.blocked = time.perf_counter() - start
        self._pending = pending
        logger.info(
            "checkpoint step-%d: blocked %.2fs, writing to %s in the background",
            step,
            pending.blocked,
            tmp,
        )

    def maybe_wait_for_staging(self) -> None:
        """Wait until the pending async save has copied the state out (pinned-memory mode).

        Registered as a step pre-hook on every optimizer, so parameters are never updated while
        they are being copied; calling it by hand is harmless.
        """
        pending = self._pending
        if pending is not None and pending.staging is not None:
            start = time.perf_counter()
            pending.staging.result()
            pending.staging = None
            pending.blocked += time.perf_counter() - start

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.maybe_wait_for_staging()

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        start = time.perf_counter()
        error = None
        try:
            if pending.staging is not None:
                pending.staging.result()
            pending.upload.result()
        except (Exception, CheckpointException) as e:
            error = _describe(e)
        finally:
            if pending.stager is not None:
                pending.stager.close()  # frees (unpins) its buffers
        error = self._agree(error)
        if error is not None:
            raise CheckpointError(f"checkpoint step-{pending.step} could not be written: {error}")
        self._commit(pending.final, pending.tmp)
        finished = pending.done_at or time.perf_counter()
        logger.info(
            "checkpoint step-%d saved to %s: blocked %.2fs when started, %.2fs to finish; "
            "written %.2fs after it started",
            pending.step,
            pending.final,
            pending.blocked,
            time.perf_counter() - start,
            finished - pending.started,
        )

    def _prepare(self, tmp: Path) -> None:
        """Rank 0, before a save: create the folder, remove what earlier runs left in progress."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self._cleaned_transient:
            self._cleaned_transient = True
            for child in self.folder.iterdir():
                if TRANSIENT_RE.match(child.name) and child.is_dir():
                    logger.warning("removing unfinished checkpoint folder %s", child)
                    shutil.rmtree(child)
        if tmp.exists():
            shutil.rmtree(tmp)

    def _commit(self, final: Path, tmp: Path) -> None:
        self._barrier()  # every rank has written its files (and rank 0 the .metadata)
        self._on_rank0(lambda: self._rename(final, tmp))
        if self.cfg.keep_latest_k > 0:
            self._on_rank0(self._purge)

    def _rename(self, final: Path, tmp: Path) -> None:
        if not is_complete(tmp):
            raise CheckpointError(f"checkpoint {tmp} has no .metadata after saving")
        if final.exists():
            if not is_complete(final):
                raise CheckpointError(
                    f"cannot save {final}: it exists and is not a complete checkpoint; move it away"
                )
            # A step saved again (resumed from an earlier load_step): swap, then delete the old.
            old = final.with_name(final.name + ".old.tmp")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
            logger.warning("replaced the existing checkpoint %s", final)
        else:
            tmp.rename(final)

    def _purge(self) -> None:
        """Rank 0: delete complete steps older than the newest keep_latest_k (never step-0)."""
        doomed = [s for s in complete_steps(self.folder) if s > 0][self.cfg.keep_latest_k :]
        if not doomed:
            return
        logger.info(
            "deleting checkpoints %s (keep_latest_k=%d)",
            ", ".join(f"step-{s}" for s in doomed),
            self.cfg.keep_latest_k,
        )
        if self._purger is None:
            self._purger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-purge")
        for step in doomed:
            path = self.folder / f"step-{step}"
            # Renamed first (atomic), so a half-deleted folder is never taken for a checkpoint.
            trash = path.with_name(path.name + ".deleting.tmp")
            path.rename(trash)
            self._purger.submit(shutil.rmtree, trash, True)

    # ----------------------------------------------------------------------- loading

    def load(self) -> int:
        """Restore the states at the start of a run; returns the step to continue after.

        1. ``enable`` and the folder holds complete steps: the latest (or ``load_step``), every
           state but ``exclude_from_loading``; when the latest fails to load, the previous one.
        2. else ``initial_load_path`` (a DCP checkpoint; not with ``initial_load_in_hf``): its
           model weights (every state with ``initial_load_model_only=False``).
        3. else nothing: 0.
        Call it on every rank, after the model is materialized and before training; then
        re-create the data iterator (``iter(dataloader)``).
        """
        c = self.cfg
        if c.enable:
            steps, incomplete = self._on_rank0(
                lambda: (complete_steps(self.folder), _incomplete_folders(self.folder))
            )
            if incomplete:
                logger.warning(
                    "ignoring incomplete checkpoint folders in %s: %s",
                    self.folder,
                    ", ".join(incomplete),
                )
            if c.load_step != -1 and c.load_step not in steps:
                raise CheckpointError(
                    f"--checkpoint.load_step {c.load_step}: no complete checkpoint "
                    f"step-{c.load_step} in {self.folder} (complete steps: {_listing(steps)})"
                )
            if steps:
                return self._resume(steps if c.load_step == -1 else [c.load_step])
            logger.info("no checkpoint in %s to resume from", self.folder)
        if c.initial_load_path and not c.initial_load_in_hf:  # HF weights: the trainer loads them
            path = Path(c.initial_load_path)
            self._on_rank0(lambda: check_loadable(path))
            wanted = ["model"] if c.initial_load_model_only else self._wanted()
            start = time.perf_counter()
            loaded, error = self._try_load(path, wanted)
            if error is not None:
                raise CheckpointError(f"could not load {path}: {error}")
            step = self.train_state.step if "train_state" in loaded else 0
            self.train_state.step = step
            logger.info(
                "loaded %s from %s in %.2fs",
                ", ".join(loaded),
                path,
                time.perf_counter() - start,
            )
            return step
        return 0

    def _wanted(self) -> list[str]:
        return [k for k in self.states if k not in self.cfg.exclude_from_loading]

    def _resume(self, order: list[int]) -> int:
        start = time.perf_counter()
        error = None
        for i, step in enumerate(order):
            loaded, error = self._try_load(self.folder / f"step-{step}", self._wanted())
            if error is None:
                return self._resumed(step, loaded, start)
            if i + 1 < len(order):
                logger.warning(
                    "checkpoint step-%d could not be loaded (%s); falling back to step-%d",
                    step,
                    error,
                    order[i + 1],
                )
        if len(order) == 1:
            raise CheckpointError(f"checkpoint step-{order[0]} could not be loaded: {error}")
        raise CheckpointError(
            f"none of the checkpoints in {self.folder} could be loaded "
            f"(steps {_listing(order)}); the oldest failed with {error}"
        )

    def _resumed(self, step: int, loaded: list[str], start: float) -> int:
        if "train_state" in loaded:
            resumed = self.train_state.step
        elif "train_state" in self.cfg.exclude_from_loading:
            resumed = 0
        else:  # a model-only step: the seed (step-0) or a last_save_model_only export
            resumed = step
            if step > 0:
                logger.warning(
                    "checkpoint step-%d holds model weights only: optimizer, lr schedule and data "
                    "position start fresh",
                    step,
                )
        self.train_state.step = resumed
        self.resumed = True
        logger.info(
            "resumed from %s (%s) in %.2fs; continuing after step %d",
            self.folder / f"step-{step}",
            ", ".join(loaded),
            time.perf_counter() - start,
            resumed,
        )
        return resumed

    def _try_load(self, path: Path, wanted: list[str]) -> tuple[list[str], str | None]:
        """Load ``wanted`` ∩ what ``path`` holds; -> (states loaded, error agreed by all ranks)."""
        error = names = None
        try:
            names = read_state_names(path)
        except Exception as e:
            error = _describe(e)
        error = self._agree(error)
        if error is not None:
            return [], error
        loaded = [k for k in wanted if k in names]
        if "model" not in loaded:
            return [], f"{path} holds no model weights"
        missing = [k for k in wanted if k not in names]
        if missing and loaded != ["model"]:
            logger.warning("%s holds no %s; not restored", path, ", ".join(missing))
        try:
            dcp.load(
                {k: self.states[k] for k in loaded},
                storage_reader=SafeFileSystemReader(str(path)),
                planner=SafeLoadPlanner(),
                no_dist=not self._distributed,
            )
        except (Exception, CheckpointException) as e:
            error = _describe(e)
        return loaded, self._agree(error)

    # ----------------------------------------------------------------------- the end

    def close(self) -> None:
        """Finish a pending async save (wait, rename), stop the helpers. Call on every rank."""
        if self._closed:
            return
        self._closed = True
        try:
            self._finish_pending()
        finally:
            for hook in self._hooks:
                hook.remove()
            self._hooks = []
            if self._purger is not None:
                self._purger.shutdown(wait=True)


# --------------------------------------------------------------------------- seed checkpoint


def save_seed_checkpoint(model: nn.Module, path: str | Path) -> Path:
    """Write ``model``'s weights to a new DCP folder, atomically (temporary name, then rename).

    One process writes the full model; every layout then loads it (DCP reshards). Written to
    ``<folder>/step-0`` it is also what a run with ``checkpoint.enable`` starts from.
    """
    path = Path(path)
    if path.exists():
        raise ConfigError(
            f"seed checkpoint {path} already exists; remove it or choose another path"
        )
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.perf_counter()
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(tmp), no_dist=True)
    tmp.rename(path)
    logger.info("seed checkpoint written to %s in %.1fs", path, time.perf_counter() - start)
    return path


def check_loadable(path: str | Path) -> None:
    """One-line error if ``path`` is not a complete DCP checkpoint."""
    if not (Path(path) / ".metadata").is_file():
        raise ConfigError(f"no complete DCP checkpoint at {path} (its .metadata file is missing)")


def load_model_weights(model: nn.Module, path: str | Path) -> None:
    """Load weights saved by any layout into ``model`` in its current (sharded) layout."""
    start = time.perf_counter()
    state = {"model": get_model_state_dict(model)}
    dcp.load(
        state,
        storage_reader=SafeFileSystemReader(str(path)),
        planner=SafeLoadPlanner(),
        no_dist=not (dist.is_available() and dist.is_initialized()),
    )
    set_model_state_dict(model, state["model"])
    logger.info("loaded model weights from %s in %.1fs", path, time.perf_counter() - start)
