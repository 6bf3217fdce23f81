"""The Flight Recorder tests of tests/distributed/test_flight_recorder.py on 2 GPUs with NCCL.

On NCCL the dumps come from the watchdog (TORCH_NCCL_DUMP_ON_TIMEOUT, set by configure_env): the
rank that times out dumps, tells the others through the store to dump too, and aborts, so the
worker's Python error path (and its timing file) may never run; or from dump_on_failure when
torchrun's SIGTERM reaches a rank first.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.distributed.launch import ROOT
from tests.distributed.test_flight_recorder import run_faulty_job

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)


def report(tmp_path) -> list[str]:
    traces = tmp_path / "comm_traces"
    dumps = sorted(p.name for p in traces.iterdir()) if traces.is_dir() else []
    assert dumps == ["rank_0", "rank_1"], dumps
    out = subprocess.run(
        [sys.executable, "-m", "torchtitan.observability.hang_report", str(traces)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    print(out.stdout)
    return out.stdout.splitlines()


@pytest.mark.parametrize(
    "fault", ["delay:rank=1:step=3:seconds=60", "skip_collective:rank=1:step=3"]
)
def test_nccl_hang_ends_with_dumps_that_name_rank_1(tmp_path, fault):
    rc, wall, log = run_faulty_job(tmp_path, fault, device="cuda")
    print(f"{fault}: rc={rc}, wall {wall:.1f}s")
    assert rc != 0, log[-3000:]
    lines = report(tmp_path)
    # torchrun start-up, the 5 s timeout, the watchdog's wait for the dump (up to
    # TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC: 15 s as configure_env sets it; torch 2.11 waited 60 s
    # without it, and the whole job took 108 s) and the abort.
    assert wall < 100, wall
    assert lines[0].startswith("rank 1 "), "\n".join(lines)
    assert "all_reduce" in lines[0] or "all_gather" in lines[0], "\n".join(lines)
