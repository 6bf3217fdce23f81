"""A killed test run leaves no process behind.

Many processes of a test run are in sessions of their own, where a terminal's Ctrl-C or a
killed process group does not reach them: the distributed tests' fork server and the runs it
forks (``tests/distributed/fork_server.py``), torchrun and its ranks. Two mechanisms:

* **Stop signals.** Every pytest process (the controller and each xdist worker) handles SIGTERM,
  SIGHUP and SIGINT by SIGKILLing every process below it (and the process groups they lead),
  then ends as the signal asks (SIGINT: ``KeyboardInterrupt``, so pytest still reports).
* **Parent death.** An xdist worker gets SIGTERM when the controller ends (``PR_SET_PDEATHSIG``,
  Linux; the worker then stops as above), and the fork server, the runs it forks and their
  ranks get SIGKILL when their parent ends: even a SIGKILLed worker takes the fork server and
  its runs with it. (A torchrun a test started itself is reached by the stop signals; its ranks
  also stop when their launcher dies, ``runtime.LauncherWatch``.)

``tests/conftest.py`` installs it in every pytest process (``pytest_configure``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def die_with_parent(expected_parent: int, signum: int = signal.SIGKILL) -> None:
    """This process gets ``signum`` when its parent ends (Linux; elsewhere nothing). Ends now
    if the parent (``expected_parent``) is already gone. The parent is the thread that forked:
    call it only in a process started from its parent's main thread."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(128 + signum)


def descendants(pid: int, running_only: bool = False) -> list[int]:
    """Every descendant of ``pid`` (Linux /proc; [] without it); ``running_only``: not the
    zombies (ended, not yet reaped: nothing left to kill)."""
    children: dict[int, list[int]] = {}
    zombies = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        child = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(child)
        if fields[0] in ("Z", "X"):
            zombies.add(child)
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return [p for p in found if p not in zombies] if running_only else found


def running(pid: int) -> bool:
    """Alive and not a zombie (Linux /proc)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def sigkill_groups(pids: list[int]) -> None:
    """SIGKILL each pid's process group, or the process alone where it leads none."""
    for each in pids:
        try:
            os.killpg(each, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(each, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def kill_descendants(rounds: int = 10) -> None:
    """SIGKILL every process below this one, again until none runs (a process may fork while
    the others die)."""
    for _ in range(rounds):
        pids = descendants(os.getpid(), running_only=True)
        if not pids:
            return
        sigkill_groups(pids)
        time.sleep(0.05)


def _on_stop_signal(signum, frame) -> None:
    kill_descendants()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install(xdist_worker: bool) -> None:
    """In a pytest process: the stop-signal handlers, and for an xdist worker, SIGTERM when
    its controller ends."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_stop_signal)
    if xdist_worker:
        die_with_parent(os.getppid(), signal.SIGTERM)


def pytest_configure(config) -> None:
    install(xdist_worker=hasattr(config, "workerinput"))
