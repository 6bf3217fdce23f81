"""The Flight Recorder tests of tests/distributed/test_flight_recorder.py on 2 GPUs with NCCL.

On NCCL the dumps come from the watchdog (TORCH_NCCL_DUMP_ON_TIMEOUT, set by configure_env): the
rank that times out dumps, tells the others through the store to dump too, sleeps
4 x comm.dump_wait_seconds and aborts, so the worker's Python error path may never run; or from
dump_on_failure when torchrun's SIGTERM reaches a rank first.

The time bounds come from the configured timeouts and from what ProcessGroupNCCL does with them
(torch 2.11-2.13), not from one card's measurements. Per rank:

* the watchdog thread (every 100 ms) finds the collective older than the train timeout ``T``,
  writes the dump signal to the store, sleeps ``4 W`` (``W`` = dump_wait_seconds) and then aborts
  the communicators (measured: up to ``ABORT`` s) and the process;
* the heartbeat monitor of the default group sees the signal, its own rank's or another's through
  the store, within one poll (``TORCH_NCCL_COORD_CHECK_MILSEC``, 1 s by default: ``POLL``), and
  dumps with Python stacks, waiting for that dump up to ``W``; if it is not done by then, it dumps
  again without stacks, waiting up to ``W`` more. So a rank's first dump file exists by
  ``T + POLL + 2 W``, well before any dump the Python error path could write, which needs the
  abort, after ``T + 4 W``.

Measured, from the fault to the first dump: 9-12 s on 2xH200, 14.2 s on 2xH100 (T = 5, W = 8);
14.2 s is T + POLL + W and a bit: it fits a stack dump that did not finish within W, followed by
the stack-free one. The old bound, T + W = 13 s, only held where the stack dump finished within W.
It also read the files' modification times, which a later rewrite moves (a rank's Python error
path dumps again after the abort); ``DumpWatch`` notes when each file first appears instead.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import hang_report
from tests.distributed.test_flight_recorder import TRAIN_TIMEOUT, run_faulty_job

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)

DUMP_WAIT = 8  # W: comm.dump_wait_seconds
POLL = 1  # the heartbeat monitor's poll for a dump signal (TORCH_NCCL_COORD_CHECK_MILSEC)
ABORT = 20  # aborting the communicators after the sleep: measured up to 20 s on 2xH200
STARTUP = 25  # launch to the fault (step 3): torchrun, CUDA and NCCL init, two steps
MARGIN = 3  # file system, thread scheduling and the 0.1 s watch below, on a busy host

# Both dumps exist by then: the watchdog's dump with stacks, or the stack-free retry after it.
FIRST_DUMPS_BY = TRAIN_TIMEOUT + POLL + 2 * DUMP_WAIT + MARGIN  # 25 s
# The Python error path cannot dump before the abort: a dump by FIRST_DUMPS_BY is the watchdog's.
ABORT_STARTS = TRAIN_TIMEOUT + 4 * DUMP_WAIT  # 37 s
assert FIRST_DUMPS_BY < ABORT_STARTS
# The last write to a dump file: a rank that torchrun SIGTERMs after the other rank's abort
# rewrites its dump from Python (13 s: torchrun noticing the exit, the Python dump, a busy host).
LAST_DUMP_BY = ABORT_STARTS + ABORT + 13  # 70 s
# torchrun SIGTERMs the other rank after the abort; a rank blocked in a CUDA sync on the hung
# collective cannot run Python's handler, so torchrun SIGKILLs it 30 s later (8 s: the exits and
# torchrun's teardown).
WALL_BOUND = STARTUP + ABORT_STARTS + ABORT + 30 + 8  # 120 s


class DumpWatch:
    """When each ``rank_<r>`` dump file first appears (a later rewrite moves its mtime)."""

    def __init__(self, folder: Path, ranks=(0, 1), every: float = 0.1):
        self.folder, self.ranks, self.every = folder, ranks, every
        self.first_seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set() and len(self.first_seen) < len(self.ranks):
            for rank in self.ranks:
                if rank not in self.first_seen and (self.folder / f"rank_{rank}").exists():
                    self.first_seen[rank] = time.time()
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def report(tmp_path) -> list[str]:
    traces = tmp_path / "comm_traces"
    dumps = sorted(p.name for p in traces.iterdir()) if traces.is_dir() else []
    assert dumps == ["rank_0", "rank_1"], dumps
    lines = hang_report(traces)
    print("\n".join(lines))
    return lines


def fault_time(tmp_path) -> float:
    return json.loads((tmp_path / "timing_1.json").read_text())["step_start"]["3"]


@pytest.mark.parametrize(
    "fault", ["delay:rank=1:step=3:seconds=60", "skip_collective:rank=1:step=3"]
)
def test_nccl_hang_ends_with_dumps_that_name_rank_1(tmp_path, fault):
    with DumpWatch(tmp_path / "comm_traces") as watch:
        rc, wall, log = run_faulty_job(
            tmp_path, fault, device="cuda", worker_args=(f"--dump-wait={DUMP_WAIT}",)
        )
    fault_at = fault_time(tmp_path)
    first = {r: t - fault_at for r, t in watch.first_seen.items()}
    last = {r: (tmp_path / "comm_traces" / f"rank_{r}").stat().st_mtime - fault_at for r in (0, 1)}
    print(f"{fault}: rc={rc}, wall {wall:.1f}s, dumps first seen {first}, last written {last}")
    assert rc != 0, log[-3000:]
    lines = report(tmp_path)
    assert lines[0].startswith("rank 1 "), "\n".join(lines)
    assert "all_reduce" in lines[0] or "all_gather" in lines[0], "\n".join(lines)
    assert sorted(first) == [0, 1], first
    assert max(first.values()) < FIRST_DUMPS_BY, (first, FIRST_DUMPS_BY)
    assert max(last.values()) < LAST_DUMP_BY, (last, LAST_DUMP_BY)
    assert wall < WALL_BOUND, (wall, WALL_BOUND)
