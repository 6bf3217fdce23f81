"""torch.profiler traces and CUDA memory snapshots, a window every ``profile_freq`` steps.

    with maybe_profile(cfg.profiling, cfg.job.dump_folder, rank, start_step=step) as prof:
        for ...:
            train_step()
            prof.step()

Traces: ``<dump_folder>/<save_traces_folder>/iteration_<N>/rank<r>_trace.json`` (open in
chrome://tracing or https://ui.perfetto.dev), where N is the step that ended the window.
Each window is ``profiler_warmup`` steps of warm-up, then ``profiler_active`` recorded steps,
ending on a multiple of ``profile_freq``.

Memory snapshots (CUDA only; on CPU a warning says it is skipped):
``<dump_folder>/<save_memory_snapshot_folder>/iteration_<N>/rank<r>_memory_snapshot.pickle`` every
``profile_freq`` steps, and ``iteration_<N>_exit/`` when the block ends in an out-of-memory error
(open them in https://pytorch.org/memory_viz).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

logger = logging.getLogger("torchtitan")

MEMORY_HISTORY_ENTRIES = 100_000


class StepProfiler:
    """Context manager; call ``step()`` once at the end of every training step."""

    def __init__(self, cfg, dump_folder: str | os.PathLike, rank: int, start_step: int = 0):
        self.cfg = cfg
        self.rank = rank
        self.step_num = start_step
        self.trace_folder = Path(dump_folder) / cfg.save_traces_folder
        self.memory_folder = Path(dump_folder) / cfg.save_memory_snapshot_folder
        self._profiler = None
        self._memory = False
        if cfg.enable_profiling:
            self._profiler = self._build_profiler(start_step)
        if cfg.enable_memory_snapshot:
            if torch.cuda.is_available():
                self._memory = True
            else:
                logger.warning("profiling: enable_memory_snapshot needs CUDA; skipped on this run")

    def _build_profiler(self, start_step: int):
        cfg = self.cfg
        wait = cfg.profile_freq - cfg.profiler_warmup - cfg.profiler_active
        if cfg.profile_freq <= 0 or cfg.profiler_active <= 0 or wait < 0:
            raise ValueError(
                "profiling needs profile_freq >= profiler_warmup + profiler_active and "
                f"profiler_active >= 1; got {cfg.profile_freq}, {cfg.profiler_warmup}, "
                f"{cfg.profiler_active}"
            )
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=wait, warmup=cfg.profiler_warmup, active=cfg.profiler_active
            ),
            on_trace_ready=self._save_trace,
            record_shapes=True,
        )
        # Resume: line the windows up with the global step, not with this process's first step.
        profiler.step_num = start_step
        profiler.current_action = profiler.schedule(start_step)
        return profiler

    def _save_trace(self, profiler) -> None:
        folder = self.trace_folder / f"iteration_{self.step_num}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}_trace.json"
        start = time.perf_counter()
        profiler.export_chrome_trace(str(path))
        logger.info("profiling: wrote %s in %.1fs", path, time.perf_counter() - start)

    def _save_memory(self, name: str) -> Path:
        folder = self.memory_folder / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}_memory_snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        logger.info("profiling: wrote memory snapshot %s", path)
        return path

    def step(self) -> None:
        self.step_num += 1
        if self._profiler is not None:
            self._profiler.step()
        if self._memory and self.step_num % self.cfg.profile_freq == 0:
            self._save_memory(f"iteration_{self.step_num}")

    def __enter__(self) -> StepProfiler:
        if self._memory:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        if self._profiler is not None:
            self._profiler.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if (
                self._memory
                and exc_type is not None
                and issubclass(exc_type, torch.OutOfMemoryError)
            ):
                self._save_memory(f"iteration_{self.step_num}_exit")
        finally:
            if self._memory:
                torch.cuda.memory._record_memory_history(enabled=None)
            if self._profiler is not None:
                self._profiler.__exit__(exc_type, exc, tb)


def maybe_profile(cfg, dump_folder: str | os.PathLike, rank: int, start_step: int = 0):
    """A ``StepProfiler`` for the ``[profiling]`` section ``cfg``; inert when nothing is enabled.

    ``start_step`` is the last step already done (a resumed run), so windows stay on multiples
    of ``profile_freq``.
    """
    return StepProfiler(cfg, dump_folder, rank, start_step)
