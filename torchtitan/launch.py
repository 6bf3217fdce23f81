"""``python -m torchtitan.launch``: torchrun (same options), ending in one line that says why.

``run_train.sh`` starts the trainer through this module. It runs ``torch.distributed.run`` and
changes what the user sees at the end:

* **The reason, last.** When ranks fail, torchrun raises ``ChildFailedError``: a ~30-line traceback
  whose "root cause" is the earliest failure to the second, often a rank that merely lost its
  peer. Each rank writes its one-line ending to its error file (``torchtitan/exits.py``); this
  launcher prints the most telling one as the last line, and exits with that rank's code.
* **Every rank's output kept.** For ``-m torchtitan.train`` without ``--log-dir`` the ranks' logs
  (with ``--tee``/``--redirects``) go to ``<job.dump_folder>/logs/<time>/`` instead of a temporary
  folder; the end of the output says where.
* **Ctrl-C.** torchrun forwards the first Ctrl-C to every rank, which saves after its step and
  stops (130). A second Ctrl-C would make torchrun SIGTERM the ranks and exit with a traceback
  while they save; here it is forwarded as a Ctrl-C, and the ranks stop at once, unsaved.
* **SIGTERM** (a scheduler): torchrun forwards it, the ranks save and stop (143), no traceback.
* **Time to save.** torchrun SIGKILLs the ranks its shutdown timeout after it forwarded a signal
  (30 s by default, less than an 8B checkpoint save). Where torch has the option
  (``--shutdown-timeout``, torch >= 2.12), this launcher raises it to ``SHUTDOWN_TIMEOUT`` unless
  the user set it (the flag, ``PET_SHUTDOWN_TIMEOUT`` or ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``);
  older torch keeps its fixed 30 s.
* **One run per dump folder.** A single-node trainer launch takes ``<job.dump_folder>/run.lock``
  (``torchtitan/run_lock.py``) before anything is written and holds it for its ranks until it
  ends; a second launch in the same folder ends at once with one line naming the holder (2).
* **A launcher that dies** without a word (SIGKILL) takes its ranks with it: each rank watches
  its parent and stops within a second (``runtime.LauncherWatch``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

STOP_SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}


def stop_signal_name(signum: int) -> str:
    return STOP_SIGNAL_NAMES.get(signum, signal.Signals(signum).name)


# What a rank's line says about the job (torchtitan/exits.py writes it), most telling first: the
# launcher shows a line of the first kind here that a rank reported, the earliest of them. A
# communication failure is usually the consequence of another rank's error, a stop that of a
# signal or of torchrun tearing down. (Defined here, not in exits.py, to keep the launcher's
# imports light: exits imports the trainer's runtime.)
KINDS = ("error", "communication", "stopped")
SHUTDOWN_TIMEOUT = 300  # s from a forwarded signal to torchrun's SIGKILL: time for a save
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"  # torch's own, read where the flag is unset
SIGNAL_HINTS = {
    "SIGKILL": " (out of host memory? the kernel's OOM killer sends it: see dmesg)",
    "SIGABRT": " (an abort in native code: see the end of its log)",
    "SIGSEGV": " (a crash in native code: see the end of its log)",
}


@dataclass
class RankEnding:
    rank: int
    code: int
    line: str
    kind: str
    time: float
    log_folder: Path | None  # the folder of this rank's stdout.log / stderr.log


def from_failure(rank: int, failure: ProcessFailure) -> RankEnding:
    """A failed rank's ending: its own line where it wrote one, else what its exit code says."""
    data = failure.error_file_data.get("torchtitan")
    folder = Path(failure.error_file).parent if os.path.isfile(failure.error_file) else None
    if isinstance(data, dict):
        return RankEnding(rank, failure.exitcode, data["line"], data["kind"], data["time"], folder)
    if failure.exitcode < 0:
        name = failure.signal_name()
        line = f"error: killed by {name}{SIGNAL_HINTS.get(name, '')}"
    else:
        line = f"error: exited with code {failure.exitcode} without saying why (see its log)"
    return RankEnding(rank, failure.exitcode, line, KINDS[0], failure.timestamp, folder)


def from_error_files(log_dir: Path, since: float) -> list[RankEnding]:
    """The endings the ranks of this launch wrote into their error files under ``log_dir``."""
    endings = []
    for path in log_dir.rglob("error.json") if log_dir.is_dir() else []:
        try:
            if path.stat().st_mtime < since:
                continue
            data = json.loads(path.read_text()).get("torchtitan")
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            fields = (data["rank"], data["code"], data["line"], data["kind"], data["time"])
            endings.append(RankEnding(*fields, path.parent))
    return endings


def most_telling(endings: list[RankEnding]) -> RankEnding | None:
    """The cause before its consequences (``KINDS`` order), then the earliest."""
    order = {kind: i for i, kind in enumerate(KINDS)}
    return min(endings, key=lambda e: (order.get(e.kind, 0), e.time), default=None)


def summary(ending: RankEnding | None, several_ranks: bool, log_dir: Path | None) -> list[str]:
    """The last lines: where every rank's output is, then the reason."""
    lines = []
    if ending is not None and ending.log_folder is not None:
        attempt = ending.log_folder.parent
        lines.append(f"logs of every rank: {attempt}/<local rank>/{{stdout,stderr}}.log")
    elif log_dir is not None and log_dir.is_dir():
        lines.append(f"logs of every rank: {log_dir}/")
    if ending is not None:
        lines.append(f"rank {ending.rank}: {ending.line}" if several_ranks else ending.line)
    return lines


class CtrlC:
    """SIGINT in the launcher. The first one stops torchrun's agent like its own handler would:
    the agent then sends SIGINT to every rank and waits for them. Later ones go straight to the
    ranks (each is a process group of its own), so the agent keeps waiting while they abort."""

    def __init__(self):
        self.presses = 0

    def __call__(self, signum, frame):
        self.presses += 1
        ranks = child_pids(os.getpid()) if self.presses > 1 else []
        if not ranks:
            raise SignalException(f"Process {os.getpid()} got signal: SIGINT", signal.SIGINT)
        for pid in ranks:
            try:
                os.killpg(pid, signal.SIGINT)
            except (ProcessLookupError, PermissionError):
                pass


def child_pids(parent: int, running_only: bool = False) -> list[int]:
    """The children of process ``parent`` (under torchrun: the ranks of this node, children of
    its agent), from /proc; [] where there is no /proc. ``running_only``: not those that exited
    (zombies not yet reaped)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if int(ppid) == parent and not (running_only and state in "ZX"):
            pids.append(int(stat.parent.name))
    return pids


def several_nodes(args) -> bool:
    return torchrun.parse_min_max_nnodes(args.nnodes)[1] > 1


def trainer_dump_folder(args) -> str | None:
    """The ``job.dump_folder`` of a ``-m torchtitan.train`` launch; None for another target or
    a config that does not parse (the ranks then say why)."""
    if not (args.module and args.training_script == "torchtitan.train"):
        return None
    from torchtitan.config import ConfigError, parse_args

    try:
        return parse_args(list(args.training_script_args)).job.dump_folder
    except (ConfigError, SystemExit):
        return None


def default_log_dir(args, dump_folder: str | None) -> Path | None:
    """``<job.dump_folder>/logs/<time>[-<node>]`` for the trainer, unless ``--log-dir`` is set."""
    if args.log_dir or dump_folder is None:
        return Path(args.log_dir) if args.log_dir else None
    node = f"-{socket.gethostname()}" if several_nodes(args) else ""
    stamp = f"{datetime.now():%Y%m%d-%H%M%S}{node}"
    return Path(dump_folder).expanduser().absolute() / "logs" / stamp


def lock_dump_folder(args, dump_folder: str | None):
    """A single-node trainer launch holds the dump folder's lock for its ranks (``run_lock``;
    they see ``HELD_ENV``), taken before anything is written, torchrun's restarts included.
    Several nodes: rank 0 of the job takes it. -> the lock, or None; ``ConfigError`` (one
    line) when another run holds it."""
    if dump_folder is None or several_nodes(args):
        return None
    from torchtitan import run_lock

    lock = run_lock.acquire(dump_folder)
    if lock is None:
        print(f"warning: {run_lock.unsupported_warning(dump_folder)}", file=sys.stderr)
        return None
    if lock.note:
        print(f"warning: {lock.note}", file=sys.stderr)
    os.environ[run_lock.HELD_ENV] = str(lock.path)
    return lock


def allow_time_to_save(args, environ=os.environ) -> None:
    """Raise torchrun's shutdown timeout to ``SHUTDOWN_TIMEOUT`` unless the user set one; torch
    before 2.12 has no such option (its parsed args lack ``shutdown_timeout``): 30 s, fixed."""
    if hasattr(args, "shutdown_timeout") and args.shutdown_timeout is None:
        if SHUTDOWN_TIMEOUT_ENV not in environ:
            args.shutdown_timeout = SHUTDOWN_TIMEOUT


def main(argv: list[str] | None = None) -> int:
    args = torchrun.parse_args(sys.argv[1:] if argv is None else argv)
    dump_folder = trainer_dump_folder(args)
    from torchtitan.config import ConfigError

    try:
        lock = lock_dump_folder(args, dump_folder)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        return run(args, default_log_dir(args, dump_folder))
    finally:
        if lock is not None:
            lock.release()


def run(args, log_dir: Path | None) -> int:
    """torchrun with ``args``, ending in the line that explains a failure; -> the exit code."""
    if log_dir is not None:
        args.log_dir = str(log_dir)
    if hasattr(args, "signals_to_handle"):  # torch >= 2.9; older ones keep torchrun's Ctrl-C
        args.signals_to_handle = ",".join(
            s for s in args.signals_to_handle.split(",") if s.strip() != "SIGINT"
        )
    allow_time_to_save(args)
    several_ranks = several_nodes(args) or str(args.nproc_per_node) != "1"
    started = time.time()
    previous = signal.signal(signal.SIGINT, CtrlC())
    try:
        torchrun.run(args)
        return 0
    except ChildFailedError as e:
        endings = [from_failure(rank, failure) for rank, failure in e.failures.items()]
        ending = most_telling(endings)
        code = ending.code if ending.code > 0 else 128 - ending.code
    except SignalException as e:
        ending = most_telling(from_error_files(log_dir, started)) if log_dir else None
        code = 128 + int(e.sigval)
        if ending is None:
            stopped = f"{stop_signal_name(e.sigval)}: stopped"
            ending = RankEnding(0, code, stopped, KINDS[2], time.time(), None)
            several_ranks = False
    finally:
        signal.signal(signal.SIGINT, previous)
    for line in summary(ending, several_ranks, log_dir):
        print(line, file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
