"""Fault handling of the real trainer: non-finite loss, SIGTERM, and a stalled rank (Flight
Recorder dump + hang report)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed.launch import TINY_JOB, hang_report, kill_tree, read_metrics, start
from tests.distributed.test_resume import read_metrics_all

HANG_REPORT = "python -m torchtitan.observability.hang_report"
JOB = [
    *[a for a in TINY_JOB if not a.startswith("--training.steps")],
    "--training.steps=10",
    "--training.local_batch_size=4",
]


def trainer_cmd(
    nproc: int | None, *args: str, launcher=("--standalone",), runner="torch.distributed.run"
) -> list[str]:
    train = ["-m", "torchtitan.train", *JOB, *args]
    if nproc is None:
        return [sys.executable, *train]
    return [
        sys.executable,
        "-m",
        runner,
        *launcher,
        f"--nproc_per_node={nproc}",
        "--local-ranks-filter=0",
        *train,
    ]


def run(cmd, tmp_path: Path, env=None, timeout=240) -> tuple[int, str]:
    log = tmp_path / f"log-{time.monotonic_ns()}.txt"
    proc = start(cmd, log, {"OMP_NUM_THREADS": "1", **(env or {})})
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise AssertionError(f"timed out:\n{log.read_text()[-3000:]}") from None
    return proc.returncode, log.read_text()


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_nan_loss_stops_or_skips_naming_the_step(tmp_path, policy):
    rc, out = run(
        trainer_cmd(None, f"--job.dump_folder={tmp_path}", f"--training.on_nonfinite={policy}"),
        tmp_path,
        env={"TORCHTITAN_FAULT": "nan_loss:step=4"},
    )
    if policy == "stop":
        assert rc == 3, out[-2000:]
        assert "error: non-finite loss (nan) and grad_norm (nan) at step 4" in out
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    else:
        assert rc == 0, out[-2000:]
        assert "step 4 skipped: non-finite loss nan" in out
        rows = read_metrics(tmp_path)
        assert [r["step"] for r in rows] == list(range(1, 11))
        assert all(r["loss"] == r["loss"] for r in rows if r["step"] != 4)  # finite after


def test_sigterm_saves_a_checkpoint_and_resume_continues(tmp_path):
    """SIGTERM during step 3 (slowed by a delay fault): step 3 is saved, the process exits 143,
    and a restart continues after step 3."""
    args = [f"--job.dump_folder={tmp_path}", "--checkpoint.enable", "--checkpoint.interval=100"]
    log = tmp_path / "first.txt"
    proc = start(trainer_cmd(None, *args), log, {"TORCHTITAN_FAULT": "delay:step=3:seconds=8"})
    try:
        deadline = time.monotonic() + 120
        while "fault injection: delay" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, log.read_text()[-2000:]
    finally:
        kill_tree(proc)
    out = log.read_text()
    assert "SIGTERM: stopping after step 3 (checkpoint step-3 saved)" in out
    assert (tmp_path / "checkpoint" / "step-3").is_dir()
    rc, out = run(trainer_cmd(None, *args), tmp_path)
    assert rc == 0 and "continuing after step 3" in out, out[-2000:]
    assert read_metrics_all(tmp_path)[-1]["step"] == 10


@pytest.mark.slow
def test_desynced_rank_ends_the_job_with_dumps_and_a_report(tmp_path):
    """Rank 1 stalls for 120 s at step 3: rank 0's next collective ends on the 5 s train timeout
    (not the 300 s init timeout), torchrun stops rank 1, every rank dumps its Flight Recorder,
    and the hang report's first line names rank 1. Launched by torchtitan.launch, the job's last
    line is rank 0's error, which says how to get that report. (A skipped collective is covered
    by test_flight_recorder.py: in the trainer the next op on the same gloo pair mismatches in
    size, which gloo answers by aborting the process.)"""
    begin = time.monotonic()
    rc, out = run(
        trainer_cmd(
            2,
            f"--job.dump_folder={tmp_path}",
            "--comm.train_timeout_seconds=5",
            runner="torchtitan.launch",
        ),
        tmp_path,
        env={"TORCHTITAN_FAULT": "delay:rank=1:step=3:seconds=120"},
        timeout=200,
    )
    assert rc == 4, out[-3000:]
    assert time.monotonic() - begin < 150, "the job was not ended by the train timeout"
    traces = tmp_path / "comm_traces"
    assert sorted(p.name for p in traces.iterdir()) == ["rank_0", "rank_1"], out[-3000:]
    lines = hang_report(traces)
    assert "rank 1" in lines[0], "\n".join(lines)
    last = out.splitlines()[-1]
    assert last.startswith("rank 0: error: communication failed: RuntimeError:"), out[-3000:]
    assert last.endswith(f"; which rank stopped where: {HANG_REPORT} {traces}"), last
    assert "Traceback" not in out, out[-3000:]


@pytest.mark.slow
def test_killed_rank_restarts_and_finishes_like_an_uninterrupted_run(tmp_path):
    """Rank 1 is SIGKILLed at step 7 of torchrun's first attempt: torchrun restarts both ranks,
    which resume from step-5 and end with the loss of an uninterrupted run. The restarted ranks
    must not read the first attempt's keys from torchrun's store (its gloo addresses: "Gloo
    connectFullMesh failed ... Connection refused", or a hang)."""
    ckpt = ["--checkpoint.enable", "--checkpoint.interval=5"]
    straight, faulty = tmp_path / "a", tmp_path / "b"
    rc, out = run(trainer_cmd(2, f"--job.dump_folder={straight}", *ckpt), tmp_path)
    assert rc == 0, out[-3000:]
    rc, out = run(
        trainer_cmd(
            2,
            f"--job.dump_folder={faulty}",
            *ckpt,
            launcher=("--standalone", "--max-restarts=1"),
        ),
        tmp_path,
        env={"TORCHTITAN_FAULT": "kill:rank=1:step=7:attempt=0"},
    )
    assert rc == 0, out[-3000:]
    assert "continuing after step 5" in out, out[-3000:]
    expected = read_metrics_all(straight)[-1]
    got = read_metrics_all(faulty)[-1]
    assert expected["step"] == got["step"] == 10
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
