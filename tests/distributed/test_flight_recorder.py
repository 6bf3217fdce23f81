"""A 2-rank gloo job whose rank 1 misbehaves at step 3 ends within the train timeout, leaves a
Flight Recorder dump for every rank, and the hang report names rank 1 and the collective."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed.launch import ROOT, hang_report, kill_tree, start, torchrun_cmd

WORKER = Path(__file__).with_name("fr_worker.py")
INIT_TIMEOUT = 120  # a hang that only the init timeout ended would blow the bounds below
TRAIN_TIMEOUT = 5
BOUND = 45  # seconds from the fault to the last rank's exit; ~7 s on an idle machine


def run_faulty_job(
    tmp_path: Path,
    fault: str,
    device: str = "cpu",
    deadline: float = 150,
    worker_args: tuple[str, ...] = (),
):
    """Launch the worker on 2 ranks with ``TORCHTITAN_FAULT=fault``; -> (rc, wall s, log)."""
    log = tmp_path / "torchrun.log"
    cmd = [
        *torchrun_cmd(2),
        str(WORKER),
        f"--dump-folder={tmp_path}",
        f"--init-timeout={INIT_TIMEOUT}",
        f"--train-timeout={TRAIN_TIMEOUT}",
        f"--device={device}",
        *worker_args,
    ]
    env = {"TORCHTITAN_FAULT": fault, "PYTHONPATH": str(ROOT)}
    begin = time.monotonic()
    proc = start(cmd, log, env)
    try:
        proc.wait(timeout=deadline)
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill_tree(proc)
    wall = time.monotonic() - begin
    assert wall < deadline, f"the job hung for {deadline}s:\n{log.read_text()[-3000:]}"
    return proc.returncode, wall, log.read_text()


def check_ended_in_time_with_dumps(tmp_path: Path, rc: int, log: str) -> list[str]:
    assert rc != 0, f"the faulty job succeeded:\n{log[-3000:]}"
    traces = tmp_path / "comm_traces"
    dumps = sorted(p.name for p in traces.iterdir()) if traces.is_dir() else []
    assert dumps == ["rank_0", "rank_1"], f"dumps: {dumps}\n{log[-3000:]}"
    # Seconds from the start of step 3 (the fault) to each rank's failure: the first rank fails
    # on the 5 s train timeout (gloo waits that long per send/recv, so a collective can take a
    # bit more), the other on its own timeout or on torchrun's SIGTERM. Without
    # set_train_timeout it would be the init timeout (120 s). Loose bound: CI machines are busy.
    timings = [json.loads((tmp_path / f"timing_{r}.json").read_text()) for r in (0, 1)]
    seconds = [t["failed_at"] - t["step_start"]["3"] for t in timings]
    errors = [t["error"] for t in timings]
    assert TRAIN_TIMEOUT - 0.5 < min(seconds) and max(seconds) < BOUND, (seconds, errors)
    return hang_report(traces)


def test_skipped_collective_is_named(tmp_path):
    rc, wall, log = run_faulty_job(tmp_path, "skip_collective:rank=1:step=3")
    lines = check_ended_in_time_with_dumps(tmp_path, rc, log)
    # Rank 1 skipped the all_reduce of step 3, so its all_gather met rank 0's all_reduce.
    assert lines[0] == (
        "rank 1 called all_gather float32[1] where rank 0 called all_reduce float32[1024] "
        "at #5 of pg 'grads' [0, 1]"
    ), "\n".join(lines)

    # torch's own analyzer reads the same dumps (pg_config was rewritten for it) and agrees.
    torch_report = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
        + [str(tmp_path / "comm_traces"), "-p", "rank_"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = torch_report.stdout + torch_report.stderr  # it logs to stderr
    assert torch_report.returncode == 0, out[-2000:]
    assert "Culprit rank 1" in out, out[-2000:]


def test_stalled_rank_is_named(tmp_path):
    # Rank 1 stalls for 60 s; rank 0 times out after 5 s, and torchrun's SIGTERM makes rank 1
    # dump too (dump_on_failure turns it into an exception).
    rc, wall, log = run_faulty_job(tmp_path, "delay:rank=1:step=3:seconds=60")
    lines = check_ended_in_time_with_dumps(tmp_path, rc, log)
    assert lines[0] == (
        "rank 1 is behind: rank 0 reached all_reduce #5 (pg 'grads' [0, 1], float32[1024]) "
        "but rank 1 stopped at #4 (all_gather float32[1])"
    ), "\n".join(lines)
    assert any("rank 1 dumped on Terminated: received SIGTERM" in line for line in lines)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
