"""Run the trainer (or a worker script) as CPU/gloo ranks and read back its per-step metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.distributed.fork_client import ForkClient, descendants, sigkill_groups

ROOT = Path(__file__).resolve().parents[2]
FORK_RANKS = Path(__file__).with_name("fork_ranks.py")
FORK_CLIENT = ForkClient()

# A tiny, fast job: the debug model, 64-token samples, global batch 8, every step logged.
TINY_JOB = [
    "--training.seq_len=64",
    "--training.global_batch_size=8",
    "--training.steps=6",
    "--lr_scheduler.warmup_steps=2",
    "--optimizer.lr=1e-3",
    "--metrics.log_freq=1",
    "--metrics.enable_tensorboard=false",
]


def with_slow(names, slow: set[str]) -> list:
    """Parametrize values: the names in ``slow`` marked for the slow tier (make test-all)."""
    return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n for n in names]


def from_seed(seed_checkpoint: str, dump_folder: Path) -> list[str]:
    """Trainer arguments: start from the seed checkpoint's weights, write to ``dump_folder``."""
    return [f"--checkpoint.initial_load_path={seed_checkpoint}", f"--job.dump_folder={dump_folder}"]


def assert_curves_match(got, reference, points: int, rtol: float) -> None:
    """Each curve in ``got`` has ``points`` values, within ``rtol`` of the reference curve at the
    same index (e.g. (loss, grad_norm) against the single-process run)."""
    for curve, expected in zip(got, reference, strict=True):
        assert len(curve) == len(expected) == points, (curve, expected)
        assert curve == pytest.approx(expected, rel=rtol), (curve, expected)


def torchrun_cmd(nproc: int) -> list[str]:
    """A single-node torchrun launch of ``nproc`` processes; append the script and its args."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
    ]


class RankAborted(AssertionError):
    """A multi-rank job failed because a rank died of SIGABRT or SIGSEGV inside torch's C++, not
    of a Python error. CI lost a run to SIGABRT once (a rank of the 16-rank 4D layout; the others
    then saw gloo's "Connection closed by peer"; 23 runs of that layout here did not reproduce
    it), and two to SIGSEGV (CPU FSDP2xTP2 runs of two different tests, 2026-11-28 and -29, each
    passing on rerun). tests/distributed reruns such a test once (conftest.py); pytest's summary
    lists the rerun with the first failure, which carries the crashed rank's stacks
    (``crash_stacks``)."""


def run_ranks(nproc: int, target: list[str], timeout: int = 300) -> str:
    """Run ``target`` (``["-m", MODULE, *ARGS]`` or ``[SCRIPT, *ARGS]``) as ``nproc`` CPU ranks;
    returns rank 0's output.

    The ranks are forks of one process that imported the trainer (``fork_ranks.py``: torchrun's
    environment without a fresh interpreter per rank, about 4.5 s of CPU each on the CI machine).
    Every rank's output also goes to a log folder, so a failure shows why the other ranks
    stopped (e.g. the one that aborted), not only rank 0's view of it.
    """
    with tempfile.TemporaryDirectory(prefix="rank-logs-") as logs:
        cmd = [sys.executable, str(FORK_RANKS), str(nproc), logs, *target]
        return run_checked(cmd, timeout, rank_logs=Path(logs))


def run_trainer(nproc: int, args: list[str], timeout: int = 300) -> str:
    """Train (``python -m torchtitan.train ARGS``) on ``nproc`` CPU ranks; rank 0's output."""
    return run_ranks(nproc, ["-m", "torchtitan.train", *args], timeout)


def rank_log_tails(logs: Path | None, lines: int = 12) -> str:
    """The last ``lines`` of each rank's log under ``fork_ranks.py``'s log folder ("" without
    one), ranks that died of a signal or a C++ abort first (their words are lost from rank 0's
    output)."""
    if logs is None:
        return ""
    tails = []
    for log in logs.glob("rank_*.log"):
        text = log.read_text(errors="replace").strip()
        if text:
            tail = "\n".join(text.splitlines()[-lines:])
            aborted = any(word in text for word in ("terminate called", "Fatal Python", "Signal "))
            tails.append((not aborted, int(log.stem.split("_")[1]), crash_stacks(text) or tail))
    return "".join(f"\n--- rank {rank} log ---\n{tail}" for _, rank, tail in sorted(tails))


def crash_stacks(text: str, most: int = 120) -> str:
    """faulthandler's report in a rank's log (from "Fatal Python error" to its list of
    extension modules: every thread's stack, the crashing one marked "Current thread"), at most
    ``most`` lines; "" without one. A tail of the log would show only the bottom frames."""
    start = text.find("Fatal Python error")
    if start < 0:
        return ""
    report = text[start:].split("\nExtension modules:")[0].splitlines()
    return "\n".join(report[:most])


def run_checked(cmd: list[str], timeout: int, rank_logs: Path | None = None) -> str:
    """Run ``cmd`` in its own session and return its output; fail the test on a non-zero exit.

    The whole process tree is killed on timeout, so a hung rank cannot outlive the test. With
    ``rank_logs`` (``fork_ranks.py``'s log folder), a failure also shows each rank's last words.
    """
    # PYTHONPATH: scripts launched by path import this checkout's torchtitan, not an installed one.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    if forkable(cmd):
        returncode, out = FORK_CLIENT.run(cmd[1:], env, str(ROOT), timeout)
    else:
        returncode, out = run_in_session(cmd, env, timeout)
    if returncode is None:
        ranks = rank_log_tails(rank_logs)
        raise AssertionError(f"timed out after {timeout}s: {cmd}\n{out[-3000:]}{ranks}")
    if returncode != 0:
        crashed = "(SIGABRT)" in out or "(SIGSEGV)" in out
        failure = RankAborted if crashed else AssertionError
        ranks = rank_log_tails(rank_logs)
        raise failure(f"failed (rc={returncode}): {cmd}\n{out[-5000:]}{ranks}")
    return out


def forkable(cmd: list[str]) -> bool:
    """Python runs of a module or script (not torchrun, not a shell script) go to the fork
    server (``fork_server.py``: forked from a process that imported the trainer once) unless it
    is busy with another run of this test process."""
    python_target = len(cmd) > 1 and (cmd[1] == "-m" or cmd[1].endswith(".py"))
    return cmd[0] == sys.executable and python_target and not FORK_CLIENT.busy


def run_in_session(cmd: list[str], env: dict, timeout: int) -> tuple[int | None, str]:
    """Run ``cmd`` in its own session; -> (exit code, or None after a timeout; its output)."""
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


def hang_report(traces: Path) -> list[str]:
    """Run ``python -m torchtitan.observability.hang_report`` on a dump folder; its lines."""
    report = subprocess.run(
        [sys.executable, "-m", "torchtitan.observability.hang_report", str(traces)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    return report.stdout.splitlines()


def read_metrics(dump_folder: Path) -> list[dict]:
    files = sorted((dump_folder / "metrics").glob("*.jsonl"))
    assert len(files) == 1, f"expected one metrics file in {dump_folder}, found {files}"
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def curves(dump_folder: Path) -> tuple[list[float], list[float]]:
    rows = [r for r in read_metrics(dump_folder) if "loss" in r]  # not validation rows
    return [r["loss"] for r in rows], [r["grad_norm"] for r in rows]


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` in the repo root, in a new session (its own process group), output to ``log``.

    For launching several torchruns at once (e.g. one per "node"); end them with ``wait_all``.
    A file rather than a pipe: nobody reads the output while several processes run.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "w") as out:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def kill_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop ``proc``'s process group and everything below it.

    torchrun starts each worker in a session of its own, so killing torchrun's group alone would
    orphan the workers: SIGTERM first (torchrun forwards it to its workers), then SIGKILL to the
    group and to every descendant's group that is still there.
    """
    if proc.poll() is not None:
        return
    tree = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    sigkill_groups([proc.pid, *tree])
    proc.wait()


def wait_all(procs: list[subprocess.Popen], logs: list[Path], timeout: int = 300) -> None:
    """Wait for concurrently started processes; all must exit 0 within ``timeout`` seconds.

    As soon as one fails, or at the deadline, every one of them is killed (``kill_tree``), so a
    rank left waiting for a dead peer cannot outlive the test.
    """
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            kill_tree(p)
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        what = f"timed out after {timeout}s" if timed_out else "failed"
        tails = "\n".join(
            f"--- process {i} (rc={rc}):\n{logs[i].read_text()[-3000:]}" for i, rc in bad
        )
        raise AssertionError(f"{len(bad)} of {len(procs)} processes {what}:\n{tails}")
