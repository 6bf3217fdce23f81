"""Run N ranks of a module or script on this machine by forking one process that has imported
the trainer.

    python tests/distributed/fork_ranks.py NPROC LOG_DIR -m MODULE ARGS...
    python tests/distributed/fork_ranks.py NPROC LOG_DIR SCRIPT.py ARGS...

What torchrun does for a single-node CPU job, minus its cost on the 2-core CI machine: each
torchrun worker is a fresh interpreter that imports torch and the trainer (about 4.5 s of CPU),
and the agent imports torch too. Here the imports happen once and every rank is a fork of the
result (copy-on-write). Nothing has run in the parent but imports, so no thread, process group or
OpenMP pool is inherited (``OMP_NUM_THREADS=1`` is set by the test launcher).

Each rank gets torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and writes stdout and stderr to
``LOG_DIR/rank_<r>.log``, then runs the target as ``python -m MODULE`` or ``python SCRIPT.py``
would (``runpy``; its ``sys.exit`` code is the rank's). Rank 0's log is copied to this process's
stdout at the end, followed by the line naming a failed rank. When a rank fails, the others get a
few seconds to end on their own, then are stopped (SIGTERM, then SIGKILL), as torchrun does; the
exit code is the first failed rank's. The parity tests use it (through ``fork_server.py``, which
saves even the parent's imports); the tests of launching itself (signals, restarts,
``run_train.sh``, several nodes) keep torchrun.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torchtitan.train  # noqa: F401  (the expensive imports, done once before the forks)

try:
    from tests.reaper import die_with_parent
except ImportError:  # run as a script: this folder is on sys.path, the checkout may not be
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.reaper import die_with_parent

GRACE_SECONDS = 5.0
# After the first failure, how long the other ranks may take to end on their own before they are
# stopped: ranks failing for the same reason (a bad flag) finish saying so.
LAST_WORDS_SECONDS = 3.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_target(target: list[str]) -> None:
    """``python -m MODULE ARGS`` (target ``["-m", MODULE, *ARGS]``) or ``python SCRIPT ARGS``."""
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(target)
        sys.path.insert(0, str(Path(target[0]).resolve().parent))
        runpy.run_path(target[0], run_name="__main__")


def run_rank(
    rank: int, nproc: int, port: int, log: Path, target: list[str], parent: int
) -> NoReturn:
    """In the forked child: become rank ``rank`` and run the target (it dies with ``parent``,
    this launcher); never returns."""

    def become_rank() -> None:
        die_with_parent(parent)
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            GROUP_RANK="0",
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        faulthandler.enable(all_threads=True)  # a rank that crashes (SIGSEGV) logs its stacks
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        run_target(target)

    run_then_exit(become_rank)


def run_then_exit(work: Callable[[], int | None]) -> NoReturn:
    """In a forked child: run ``work`` and end the process with the exit code the interpreter
    would give a program doing the same (its return value, ``sys.exit``'s code, 1 after an
    uncaught exception, printed); never returns into the parent's code."""
    code = 1
    try:
        code = work() or 0
    except SystemExit as stop:  # as the interpreter treats it: None is 0, a message is 1
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def reap(pids: set[int], seconds: float) -> None:
    """Wait up to ``seconds`` for the ranks in ``pids`` to end; removes those that did."""
    deadline = time.monotonic() + seconds
    while pids and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # every child already reaped
            pids.clear()
            return
        if pid == 0:
            time.sleep(0.05)
        pids.discard(pid)


def stop_all(pids: set[int]) -> None:
    """SIGTERM the ranks in ``pids``, then SIGKILL those still there after ``GRACE_SECONDS``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        reap(pids, GRACE_SECONDS)
        if not pids:
            return


def wait_for_ranks(ranks: dict[int, int]) -> tuple[int, str]:
    """Wait for every rank; on the first failure stop the rest. -> (the job's exit code, the
    line that names the failed rank, or "")."""
    live = set(ranks)
    while live:
        pid, status = os.waitpid(-1, 0)
        if pid not in live:
            continue
        live.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            # "(SIGABRT)" as torchrun prints it: launch.py tells a C++ abort by it.
            how = f"({signal.Signals(-code).name})" if code < 0 else f"with exit code {code}"
            reap(live, LAST_WORDS_SECONDS)
            stop_all(live)
            return (code if code > 0 else 128 - code), f"fork_ranks: rank {ranks[pid]} failed {how}"
    return 0, ""


def main(argv: list[str]) -> int:
    nproc, log_dir, target = int(argv[0]), Path(argv[1]), argv[2:]
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    sys.stdout.flush()
    sys.stderr.flush()
    ranks, me = {}, os.getpid()
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            run_rank(rank, nproc, port, log_dir / f"rank_{rank}.log", target, me)
        ranks[pid] = rank
    signal.signal(signal.SIGTERM, lambda *_: (stop_all(set(ranks)), os._exit(143)))
    code, failure = wait_for_ranks(ranks)
    sys.stdout.write((log_dir / "rank_0.log").read_text(errors="replace"))
    if failure:  # last, where a truncated failure message still shows it
        sys.stdout.flush()
        print(failure, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
