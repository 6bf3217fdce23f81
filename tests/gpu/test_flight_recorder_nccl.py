"""The Flight Recorder tests of tests/distributed/test_flight_recorder.py on 2 GPUs with NCCL.

On NCCL the dumps come from the watchdog (TORCH_NCCL_DUMP_ON_TIMEOUT, set by configure_env): the
rank that times out dumps, tells the others through the store to dump too, sleeps
4 x comm.dump_wait_seconds and aborts, so the worker's Python error path may never run; or from
dump_on_failure when torchrun's SIGTERM reaches a rank first.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.distributed.launch import hang_report
from tests.distributed.test_flight_recorder import TRAIN_TIMEOUT, run_faulty_job

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)

DUMP_WAIT = 8


def report(tmp_path) -> list[str]:
    traces = tmp_path / "comm_traces"
    dumps = sorted(p.name for p in traces.iterdir()) if traces.is_dir() else []
    assert dumps == ["rank_0", "rank_1"], dumps
    lines = hang_report(traces)
    print("\n".join(lines))
    return lines


def seconds_from_fault_to_dumps(tmp_path) -> list[float]:
    fault_at = json.loads((tmp_path / "timing_1.json").read_text())["step_start"]["3"]
    return [(tmp_path / "comm_traces" / f"rank_{r}").stat().st_mtime - fault_at for r in (0, 1)]


@pytest.mark.parametrize(
    "fault", ["delay:rank=1:step=3:seconds=60", "skip_collective:rank=1:step=3"]
)
def test_nccl_hang_ends_with_dumps_that_name_rank_1(tmp_path, fault):
    rc, wall, log = run_faulty_job(
        tmp_path, fault, device="cuda", worker_args=(f"--dump-wait={DUMP_WAIT}",)
    )
    dump_seconds = seconds_from_fault_to_dumps(tmp_path)
    print(f"{fault}: rc={rc}, wall {wall:.1f}s, dumps {dump_seconds} s after the fault")
    assert rc != 0, log[-3000:]
    lines = report(tmp_path)
    assert lines[0].startswith("rank 1 "), "\n".join(lines)
    assert "all_reduce" in lines[0] or "all_gather" in lines[0], "\n".join(lines)
    # The watchdog dumps right after the 5 s timeout (collecting the stacks takes ~3.5 s) and
    # signals the other rank, which dumps within a few seconds (measured: 9-12 s after the fault).
    # A rank that handles torchrun's SIGTERM in Python rewrites its dump later, after the abort.
    assert min(dump_seconds) < TRAIN_TIMEOUT + DUMP_WAIT, dump_seconds
    assert max(dump_seconds) < TRAIN_TIMEOUT + DUMP_WAIT + 4 * DUMP_WAIT + 20 + 5, dump_seconds
    # Then the timed-out rank sleeps 4 x DUMP_WAIT, aborts its communicators (which took up to 20 s
    # more) and the process; torchrun SIGTERMs the other rank, which, blocked in a CUDA sync on a
    # hung collective, cannot run Python's handler and is SIGKILLed 30 s later. Measured on 2xH200
    # (torch 2.11): 81-99 s from launch to exit, of which ~10 s start-up.
    assert wall < 25 + TRAIN_TIMEOUT + DUMP_WAIT + 4 * DUMP_WAIT + 20 + 30, wall
