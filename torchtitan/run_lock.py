"""One run per dump folder: an advisory lock on ``<job.dump_folder>/run.lock``.

A run takes the lock before it writes anything into its dump folder and keeps it until it ends.
A second run in the same folder gets one line naming the holder (host, pid, start time) and
exits with code 2. One process per job holds it: ``torchtitan.launch`` for a single-node job
(it tells its ranks through ``HELD_ENV``), else rank 0 of the job (``runtime.start_job``).

The lock is ``fcntl.flock``: the kernel releases it when the holder's process ends, however it
ends (SIGKILL included), so "the holder is gone" means "the lock can be taken". The file names
the holder; a run that ends normally empties it. A run that finds it named a holder while the
lock was free takes over and says so: the previous run ended without releasing it (killed, or
its node went down). Across nodes this needs a filesystem whose locks are seen by every node;
docs/checkpointing.md says which do, and what is not guaranteed.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import socket
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

from torchtitan.config import ConfigError

LOCK_NAME = "run.lock"
HELD_ENV = "TORCHTITAN_RUN_LOCK"  # set by the launcher for its ranks: the lock file it holds
# What flock raises on a filesystem without (working) locks.
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class FolderInUse(ConfigError):
    """Another run holds the dump folder's lock (a job mistake: exit code 2)."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    started: str  # local time, YYYY-mm-dd HH:MM:SS

    @staticmethod
    def this_process() -> Holder:
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        return Holder(socket.gethostname(), os.getpid(), started)

    @staticmethod
    def parse(text: str) -> Holder | None:
        """The holder a lock file names; None when it is empty or not ours."""
        try:
            data = json.loads(text)
            return Holder(str(data["host"]), int(data["pid"]), str(data["started"]))
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, started {self.started}"


def lock_path(dump_folder: str | os.PathLike) -> Path:
    return Path(dump_folder).expanduser().absolute() / LOCK_NAME


def held_by_launcher(dump_folder: str | os.PathLike, environ=os.environ) -> bool:
    """True in a rank whose launcher holds this folder's lock for the whole job."""
    return environ.get(HELD_ENV) == str(lock_path(dump_folder))


class RunLock:
    """A held lock; ``release()`` (or leaving the ``with`` block, or the object's end) gives it
    back. ``note``: the line to show when it was taken over from a run that ended without
    releasing it, else ""."""

    def __init__(self, path: Path, fd: int, note: str = ""):
        self.path, self.note = path, note
        self._fd = [fd]  # shared with the finalizer and the fork handler; -1 once let go
        weakref.finalize(self, _release, self._fd)
        # A process forked while the lock is held (a data loader worker) would share the lock
        # and keep it after this process is gone: the child drops its copy at once.
        os.register_at_fork(after_in_child=functools.partial(_forget, self._fd))

    def release(self) -> None:
        """Empty the file (nobody holds it) and unlock; idempotent."""
        _release(self._fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _forget(box: list[int]) -> None:
    """Close this process's descriptor without unlocking (LOCK_UN would also release the
    lock of every process sharing it)."""
    if box[0] >= 0:
        os.close(box[0])
        box[0] = -1


def _release(box: list[int]) -> None:
    if box[0] < 0:
        return
    try:
        os.ftruncate(box[0], 0)
        fcntl.flock(box[0], fcntl.LOCK_UN)
    except OSError:
        pass
    _forget(box)


def acquire(dump_folder: str | os.PathLike) -> RunLock | None:
    """Take ``dump_folder``'s lock (creating the folder); -> the lock, or None where the
    filesystem has no locks (``unsupported_warning`` says so). ``FolderInUse`` when another
    run holds it, a one-line ``ConfigError`` when the folder cannot be created."""
    path = lock_path(dump_folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ConfigError(
            f"job.dump_folder {path.parent} cannot be used: {e.strerror or e} ({path})"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = Holder.parse(_read(fd))
        os.close(fd)
        raise FolderInUse(in_use_message(path, holder)) from None
    except OSError as e:
        os.close(fd)
        if e.errno in UNSUPPORTED:
            return None
        raise
    previous = Holder.parse(_read(fd))
    note = ""
    if previous is not None:
        note = (
            f"job.dump_folder {path.parent}: taking over the lock of a run that ended without "
            f"releasing it ({previous.describe()})"
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(asdict(Holder.this_process())) + "\n").encode(), 0)
    return RunLock(path, fd, note)


def in_use_message(path: Path, holder: Holder | None) -> str:
    who = f"({holder.describe()})" if holder else f"(its lock file {path} names no holder yet)"
    return (
        f"job.dump_folder {path.parent} is in use by another run {who}; wait for it to end, "
        "stop it, or pass another --job.dump_folder"
    )


def unsupported_warning(dump_folder: str | os.PathLike) -> str:
    return (
        f"job.dump_folder {Path(dump_folder)}: this filesystem has no file locks, so nothing "
        "stops a second run from writing into the same folder"
    )


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode(errors="replace")
    except OSError:
        return ""
