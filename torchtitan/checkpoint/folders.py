"""``<folder>/step-<N>`` folders: written atomically, found when complete, kept to the newest K.

A step is written to ``step-<N>.tmp``; only when every rank has finished does rank 0 rename it to
``step-<N>``. A folder without DCP's ``.metadata`` file, or with a suffix, is never loaded. Only
what is recognized as ours is ever deleted: ``step-*.tmp`` leftovers, and complete steps beyond
``keep_latest_k`` (renamed to ``.deleting.tmp`` first, so a half-deleted folder is never taken for
a checkpoint). A ``step-<N>`` already in the way of a new save (incomplete, damaged, or from
another line of training) is moved aside to ``step-<N>.stale-<time>``, never deleted; so are the
complete steps after an explicit ``load_step``, before the resumed run's first save.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from torchtitan.checkpoint.errors import CheckpointError
from torchtitan.config import ConfigError

logger = logging.getLogger("torchtitan")

STEP_RE = re.compile(r"^step-(\d+)$")
TRANSIENT_RE = re.compile(r"^step-\d+(\.[a-z]+)?\.tmp$")  # ours: in progress or being deleted
STALE_RE = re.compile(r"^step-\d+\.stale-")  # set aside by a later save of the same step


def temporary(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place."""
    return path.with_name(path.name + ".tmp")


def is_complete(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").is_file()


def step_listing(steps: list[int]) -> str:
    return ", ".join(str(s) for s in sorted(steps)) or "none"


def check_loadable(path: str | Path, option: str = "") -> None:
    """One-line error if ``path`` is not a complete DCP checkpoint; it says what ``path`` is
    instead (missing, a folder of steps, a run folder) and which step to use. ``option``: the
    command-line option that named ``path``, for the message."""
    path = Path(path)
    if (path / ".metadata").is_file():
        return
    where = f"{option} {path}" if option else str(path)
    if not path.exists():
        raise ConfigError(f"{where} does not exist")
    if steps := complete_steps(path):
        raise ConfigError(
            f"{where} is a checkpoint folder, not a step; use {path / f'step-{steps[0]}'} "
            f"(steps: {step_listing(steps)})"
        )
    for child in sorted(path.iterdir()) if path.is_dir() else []:
        if steps := complete_steps(child):
            raise ConfigError(
                f"{where} is a run folder, not a checkpoint; use {child / f'step-{steps[0]}'} "
                f"(steps: {step_listing(steps)})"
            )
    raise ConfigError(f"{where} is not a complete DCP checkpoint (its .metadata file is missing)")


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


def incomplete_folders(folder: Path) -> list[str]:
    """Names of the ``step-*`` entries that are not complete checkpoints (never loaded)."""
    if not folder.is_dir():
        return []
    return sorted(
        c.name
        for c in folder.iterdir()
        if c.name.startswith("step-")
        and not STALE_RE.match(c.name)
        and not (STEP_RE.match(c.name) and is_complete(c))
    )


def find_checkpoint(path: str | Path, step: int | None = None) -> Path:
    """The DCP checkpoint to read: ``path/step-<step>``, ``path`` itself when it is one, or else
    the latest complete step in ``path``. One-line ConfigError when that is not complete."""
    path = Path(path)
    if step is not None:
        if not is_complete(path / f"step-{step}") and path.is_dir():
            raise ConfigError(
                f"no complete checkpoint step-{step} in {path} "
                f"(steps: {step_listing(complete_steps(path))})"
            )
        path = path / f"step-{step}"
    elif not is_complete(path) and (steps := complete_steps(path)):
        path = path / f"step-{steps[0]}"
    check_loadable(path)
    return path


class StepFolders:
    """Rank 0's housekeeping of one checkpoint folder; call its methods on rank 0 only."""

    def __init__(self, folder: Path, keep_latest_k: int = 0):
        self.folder = folder
        self.keep_latest_k = keep_latest_k
        # Set when a run resumed from an explicit earlier step: the steps after it are another
        # branch of training, moved aside before this run's first save.
        self.branch_point: int | None = None
        self._cleaned_transient = False
        self._purger: ThreadPoolExecutor | None = None

    def final(self, step: int) -> Path:
        return self.folder / f"step-{step}"

    def prepare(self, step: int) -> None:
        """Before saving ``step``: create the folder, remove what earlier runs left in progress,
        set aside the steps of the branch this run abandoned (``branch_point``)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.branch_point is not None:
            self._set_aside_steps_after(self.branch_point)
            self.branch_point = None
        if not self._cleaned_transient:
            self._cleaned_transient = True
            for child in self.folder.iterdir():
                if TRANSIENT_RE.match(child.name) and child.is_dir():
                    logger.warning("removing unfinished checkpoint folder %s", child)
                    shutil.rmtree(child)
            if self.keep_latest_k > 0:  # steps an earlier run kept beyond this run's k: not
                self._purge(wait=True)  # on disk with the new one (k + 1 at most while saving)
        tmp = temporary(self.final(step))
        if tmp.exists():
            shutil.rmtree(tmp)

    def publish(self, step: int) -> None:
        """After every rank has written ``step``: rename it into place, then apply keep-k."""
        self._rename(step)
        if self.keep_latest_k > 0:
            self._purge()

    def _rename(self, step: int) -> None:
        final = self.final(step)
        tmp = temporary(final)
        if not is_complete(tmp):
            raise CheckpointError(f"checkpoint {tmp} has no .metadata after saving")
        if final.exists():
            self._move_aside(final)
        tmp.rename(final)

    def _set_aside_steps_after(self, branch_point: int) -> None:
        """The run resumed from ``step-<branch_point>`` (an explicit ``load_step``): the complete
        steps after it belong to the abandoned branch. Renamed, never deleted, so that resuming
        and keep-k see only the resumed branch."""
        later = sorted(s for s in complete_steps(self.folder) if s > branch_point)
        if not later:
            return
        asides = [_rename_aside(self.final(s)) for s in later]
        logger.warning(
            "resumed from step-%d (--checkpoint.load_step) while later steps existed: moved %s "
            "aside to %s, so that only the resumed branch is resumed from and kept; delete them "
            "when you no longer need them",
            branch_point,
            ", ".join(f"step-{s}" for s in later),
            ", ".join(aside.name for aside in asides),
        )

    def _move_aside(self, path: Path) -> None:
        """A ``step-N`` in the way of a new save: an incomplete or damaged folder the load
        skipped, or a complete step of another line of training (e.g. the step count restarted
        with ``train_state`` excluded from loading). Renamed, never deleted: the new save goes
        on and nothing is lost."""
        what = "a complete checkpoint" if is_complete(path) else "not a complete checkpoint"
        aside = _rename_aside(path)
        logger.warning(
            "%s already existed (%s): moved it aside to %s, then saved; delete it when you no "
            "longer need it",
            path,
            what,
            aside.name,
        )

    def _purge(self, wait: bool = False) -> None:
        """Delete complete steps older than the newest keep_latest_k (never step-0); in the
        background unless ``wait``."""
        doomed = [s for s in complete_steps(self.folder) if s > 0][self.keep_latest_k :]
        if not doomed:
            return
        logger.info(
            "deleting checkpoints %s (keep_latest_k=%d)",
            ", ".join(f"step-{s}" for s in doomed),
            self.keep_latest_k,
        )
        if self._purger is None:
            self._purger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-purge")
        for step in doomed:
            path = self.final(step)
            trash = path.with_name(path.name + ".deleting.tmp")
            path.rename(trash)
            if wait:
                shutil.rmtree(trash, ignore_errors=True)
            else:
                self._purger.submit(shutil.rmtree, trash, True)

    def close(self) -> None:
        """Wait for the background deletions."""
        if self._purger is not None:
            self._purger.shutdown(wait=True)


def _rename_aside(path: Path) -> Path:
    """Rename ``step-N`` to ``step-N.stale-<time>`` (never loaded, counted or deleted); -> it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = path.with_name(f"{path.name}.stale-{stamp}"), 1
    while aside.exists():
        aside, n = path.with_name(f"{path.name}.stale-{stamp}-{n}"), n + 1
    path.rename(aside)
    return aside
