"""Killing a test run (``make test``: pytest with xdist workers) leaves no process behind: not
the workers, not the fork server, not the ranks it forked (``tests/reaper.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed.launch import ROOT
from tests.reaper import descendants, running, sigkill_groups

# Two ranks forked by the fork server; each writes its pid, then sleeps (in a session of its
# own on rank 1, as torchrun's workers are).
SLEEPER = """
import os, sys, time
if os.environ["RANK"] == "1":
    os.setsid()
open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w").write(str(os.getpid()))
time.sleep(600)
"""

TINY_TEST = """
from tests.distributed.launch import run_ranks

def test_sleeps():
    run_ranks(2, [{script!r}, {pids!r}], timeout=600)
"""


def start_test_run(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """A pytest run (one xdist worker, the repo's tests/conftest.py as its plugin) whose test
    sleeps in two forked ranks; -> (the pytest controller, every process below it)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    test = tmp_path / "test_tiny.py"
    test.write_text(TINY_TEST.format(script=str(tmp_path / "sleeper.py"), pids=str(pids)))
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "tests.conftest"]
    cmd += ["-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(test)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "log.txt", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 120
    while len(list(pids.iterdir())) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            sigkill_groups([proc.pid, *descendants(proc.pid)])
            raise AssertionError((tmp_path / "log.txt").read_text()[-3000:])
        time.sleep(0.1)
    time.sleep(0.2)  # both ranks' pid files are complete
    tree = descendants(proc.pid)
    ranks = [int(p.read_text()) for p in pids.iterdir()]
    assert set(ranks) <= set(tree), (ranks, tree)
    return proc, tree


@pytest.mark.parametrize(
    "how", ["SIGTERM", "SIGINT", "SIGHUP", "SIGKILL-worker"], ids=lambda how: how
)
def test_a_killed_test_run_leaves_no_process(tmp_path, how):
    """A stop signal to the pytest controller, or SIGKILL to its xdist worker (then only the
    parent-death signals can stop the fork server and the ranks): within 15 s nothing that ran
    below the controller is left."""
    proc, tree = start_test_run(tmp_path)
    try:
        if how == "SIGKILL-worker":
            (worker,) = children(proc.pid)
            os.kill(worker, signal.SIGKILL)
        else:
            os.kill(proc.pid, getattr(signal, how))
        deadline = time.monotonic() + 15
        while [p for p in tree if running(p)] and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for p in tree if running(p)]
        assert not left, f"{how}: processes left: {left}"
    finally:
        sigkill_groups([proc.pid, *tree])
        proc.wait()


def children(pid: int) -> list[int]:
    return [p for p in descendants(pid) if ppid(p) == pid]


def ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return -1
