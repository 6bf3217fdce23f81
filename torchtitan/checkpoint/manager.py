"""``CheckpointManager``: saves a training run every ``interval`` steps and resumes it.

It saves the model parts, their optimizers and LR schedulers, the data loader and a
``TrainState`` to ``<dump_folder>/<folder>/step-<N>/`` (``folders``) and resumes from the latest
complete step, falling back to the previous one when the latest fails to load. Every decision is
taken by all ranks together (``consensus``). docs/checkpointing.md describes the rules and the API.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.api import CheckpointException

from torchtitan.checkpoint.async_save import AsyncSaver
from torchtitan.checkpoint.consensus import Consensus
from torchtitan.checkpoint.errors import CheckpointError, describe_error
from torchtitan.checkpoint.folders import (
    StepFolders,
    check_loadable,
    complete_steps,
    incomplete_folders,
    step_listing,
    temporary,
)
from torchtitan.checkpoint.resume_changes import describe_changes, describe_optimizer_changes
from torchtitan.checkpoint.safe_io import load_safely, read_state_names
from torchtitan.checkpoint.space import (
    discard_failed_save,
    out_of_space,
    save_failure,
    state_bytes,
)
from torchtitan.checkpoint.states import (
    GLOBAL_STATES,
    StateTransform,
    TrainState,
    training_states,
)
from torchtitan.config import Checkpoint
from torchtitan.dtypes import dtype_from_name

logger = logging.getLogger("torchtitan")


class CheckpointManager:
    """Saves and resumes everything a training run needs; see the module doc.

    ``model_parts``: the modules this rank holds (several pipeline stages possibly; FQNs must be
    unique across them). ``optimizers`` and ``lr_schedulers``: one per part (or none).
    ``dataloader``: a StatefulDataLoader whose state is identical on every rank (rank 0's is
    saved). ``train_state``: the loop's ``TrainState``; one is created when omitted.
    ``plain_weights``: maps a part's model state dict to the tensors saved (see ``ModelState``).
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
        plain_weights: StateTransform | None = None,
    ):
        self.cfg = cfg
        self.folder = Path(dump_folder) / cfg.folder
        self.train_state = train_state if train_state is not None else TrainState()
        self.states = training_states(
            model_parts,
            optimizers,
            lr_schedulers,
            dataloader,
            self.train_state,
            plain_weights=plain_weights or (lambda state: state),
        )
        self._consensus = Consensus()
        self._folders = StepFolders(self.folder, cfg.keep_latest_k)
        self._closed = False
        self.resumed = False  # set by load() when it restored a step from the folder
        self.async_mode = cfg.async_mode if cfg.enable else "disabled"
        self._async: AsyncSaver | None = None
        if self.async_mode != "disabled":
            optimizer_state = self.states.get("optimizer")
            optimizers = optimizer_state.optimizers if optimizer_state is not None else []
            self._async = AsyncSaver(self.async_mode, optimizers, self._consensus)
            self.async_mode = self._async.mode

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
        state = self._state_to_save(model_only)
        tmp = temporary(self._folders.final(step))
        self._consensus.decide_on_rank0(lambda: self._folders.prepare(step))
        if self._async is not None and not last_step and not force:
            self._async.start(step, state, tmp, start)
            return True
        failure = None
        try:
            dcp.save(state, checkpoint_id=str(tmp), no_dist=not self._consensus.distributed)
        except (Exception, CheckpointException) as e:
            failure = (describe_error(e), out_of_space(e))
        self._raise_if_failed(step, failure)
        self._publish(step)
        what = f"model weights only, {self.cfg.export_dtype}" if model_only else "full state"
        logger.info(
            "checkpoint step-%d (%s) saved to %s: blocked %.2fs",
            step,
            what,
            self._folders.final(step),
            time.perf_counter() - start,
        )
        return True

    def _state_to_save(self, model_only: bool) -> dict[str, Any]:
        if model_only:
            dtype = dtype_from_name(self.cfg.export_dtype)
            return {"model": self.states["model"].export_state_dict(dtype)}
        rank0 = self._consensus.rank == 0
        return {k: v for k, v in self.states.items() if k not in GLOBAL_STATES or rank0}

    def _raise_if_failed(self, step: int, failure: tuple[str, bool] | None) -> None:
        """When any rank's write of ``step`` failed (``failure``: this rank's error and whether
        it was a full disk), rank 0 removes the partial folder and every rank raises the same
        line; the complete steps are untouched."""
        failures = [f for f in self._consensus.gather(failure) if f is not None]
        if not failures:
            return
        error, full = failures[0][0], any(f[1] for f in failures)
        tmp = temporary(self._folders.final(step))

        def discard() -> str:
            estimate = state_bytes(self.states["model"], self.states.get("optimizer"))
            found = discard_failed_save(tmp, step, error, full, estimate, self.cfg.keep_latest_k)
            return save_failure(found, self.folder)

        raise CheckpointError(self._consensus.decide_on_rank0(discard))

    def _publish(self, step: int) -> None:
        self._consensus.barrier()  # every rank has written its files (and rank 0 the .metadata)
        self._consensus.decide_on_rank0(lambda: self._folders.publish(step))

    def maybe_wait_for_staging(self) -> None:
        """Wait until the pending async save has copied the state out (pinned-memory mode).

        For callers that change parameters outside ``optimizer.step()``; calling it is always
        harmless. Training needs no call: in pinned mode ``AsyncSaver`` registers its own step
        pre-hook on every optimizer (``_before_optimizer_step``), so parameters are never
        updated while they are being copied.
        """
        if self._async is not None:
            self._async.wait_for_staging()

    def _finish_pending(self) -> None:
        if self._async is None:
            return
        start = time.perf_counter()
        pending = self._async.finish()
        if pending is None:
            return
        self._raise_if_failed(pending.step, pending.failure)
        self._publish(pending.step)
        finished = pending.done_at or time.perf_counter()
        logger.info(
            "checkpoint step-%d saved to %s: blocked %.2fs when started, %.2fs to finish; "
            "written %.2fs after it started",
            pending.step,
            self._folders.final(pending.step),
            pending.blocked,
            time.perf_counter() - start,
            finished - pending.started,
        )

    # ----------------------------------------------------------------------- loading

    def load(self) -> int:
        """Restore the states at the start of a run; returns the step to continue after.

        1. ``enable`` and the folder holds complete steps: the latest (or ``load_step``), every
           state but ``exclude_from_loading``; when the latest fails to load, the previous one.
           After a ``load_step``, the first ``save`` first moves the later steps aside (stale).
        2. else ``initial_load_path`` (a DCP checkpoint; not with ``initial_load_in_hf``): its
           model weights (every state with ``initial_load_model_only=False``).
        3. else nothing: 0.
        Call it on every rank, after the model is materialized and before training; then
        re-create the data iterator (``iter(dataloader)``).
        """
        c = self.cfg
        if c.enable:
            steps = self._list_steps()
            if c.load_step != -1 and c.load_step not in steps:
                raise CheckpointError(
                    f"--checkpoint.load_step {c.load_step}: no complete checkpoint "
                    f"step-{c.load_step} in {self.folder} (complete steps: {step_listing(steps)})"
                )
            if c.load_step == -1 and steps:
                return self._resume(steps)
            if steps:
                resumed = self._resume([c.load_step])
                self._folders.branch_point = c.load_step  # later steps: set aside at first save
                return resumed
            logger.info("no checkpoint in %s to resume from", self.folder)
        if c.initial_load_path and not c.initial_load_in_hf:  # HF weights: the trainer loads them
            return self._load_initial(Path(c.initial_load_path))
        return 0

    def _list_steps(self) -> list[int]:
        """The complete steps, newest first, as rank 0 sees them; warns of incomplete ones."""
        steps, incomplete = self._consensus.decide_on_rank0(
            lambda: (complete_steps(self.folder), incomplete_folders(self.folder))
        )
        if incomplete:
            logger.warning(
                "ignoring incomplete checkpoint folders in %s: %s",
                self.folder,
                ", ".join(incomplete),
            )
        return steps

    def _load_initial(self, path: Path) -> int:
        self._consensus.decide_on_rank0(
            lambda: check_loadable(path, "--checkpoint.initial_load_path")
        )
        wanted = ["model"] if self.cfg.initial_load_model_only else self._wanted()
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
        self._report_changes(loaded, step)
        return step

    def _wanted(self) -> list[str]:
        return [k for k in self.states if k not in self.cfg.exclude_from_loading]

    def _resume(self, order: list[int]) -> int:
        start = time.perf_counter()
        error = None
        for i, step in enumerate(order):
            loaded, error = self._try_load(self._folders.final(step), self._wanted())
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
            f"(steps {step_listing(order)}); the oldest failed with {error}"
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
            self._folders.final(step),
            ", ".join(loaded),
            time.perf_counter() - start,
            resumed,
        )
        self._report_changes(loaded, resumed)
        return resumed

    def _report_changes(self, loaded: list[str], step: int) -> None:
        """Log what the loaded run's settings differ in: training.steps, batch... (when the
        checkpoint recorded them) and the optimizer's hyperparameters. Nothing when the run has
        nothing left to train (the trainer says so)."""
        if step >= self.train_state.settings.get("training.steps", step + 1):
            return
        lines = []
        if "train_state" in loaded:
            schedulers = self.states.get("lr_scheduler")
            lr = schedulers.schedulers[0].get_last_lr()[0] if schedulers is not None else None
            ts = self.train_state
            lines += describe_changes(ts.saved_settings, ts.settings, step + 1, lr)
        if "optimizer" in loaded:
            optimizer = self.states["optimizer"]
            lines += describe_optimizer_changes(
                optimizer.saved_settings, optimizer.settings, step + 1
            )
        for level, line in lines:
            logger.log(level, line)

    def _try_load(self, path: Path, wanted: list[str]) -> tuple[list[str], str | None]:
        """Load ``wanted`` ∩ what ``path`` holds; -> (states loaded, error agreed by all ranks)."""
        error = names = None
        try:
            names = read_state_names(path)
        except Exception as e:
            error = describe_error(e)
        error = self._consensus.first_error(error)
        if error is not None:
            return [], error
        loaded = [k for k in wanted if k in names]
        if "model" not in loaded:
            return [], f"{path} holds no model weights"
        missing = [k for k in wanted if k not in names]
        if missing and loaded != ["model"]:
            logger.warning("%s holds no %s; not restored", path, ", ".join(missing))
        try:
            load_safely({k: self.states[k] for k in loaded}, path, self._consensus.distributed)
            if "lr_scheduler" in self.states:  # the schedule owns the lr, not the optimizer state
                self.states["lr_scheduler"].apply_to_optimizers()
        except (Exception, CheckpointException) as e:
            error = describe_error(e)
        return loaded, self._consensus.first_error(error)

    # ----------------------------------------------------------------------- the end

    def close(self) -> None:
        """Finish a pending async save (wait, rename), stop the helpers. Call on every rank."""
        if self._closed:
            return
        self._closed = True
        try:
            self._finish_pending()
        finally:
            if self._async is not None:
                self._async.remove_hooks()
            self._folders.close()
