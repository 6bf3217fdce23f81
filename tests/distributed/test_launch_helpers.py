"""The launch helpers tell a rank's C++ abort or segfault (the only failures tests/distributed
reruns) from any other failure and show a segfaulted rank's stacks; a failed trainer launch
shows every rank's last words, a rank that dies stops the others, and a run past its timeout is
killed with every process it started."""

import sys
import time
from pathlib import Path

import pytest

from tests.distributed.launch import RankAborted, run_ranks, run_trainer

# Rank 1 ends the way its argument says; rank 0 exits cleanly.
ENDING = """
import ctypes, os, sys
if os.environ["RANK"] == "1":
    if sys.argv[1] == "segfault":
        ctypes.string_at(0)  # reads address 0
    os.abort() if sys.argv[1] == "abort" else sys.exit(3)
"""


def launch_ending(tmp_path, ending: str) -> None:
    script = tmp_path / "ending.py"
    script.write_text(ENDING)
    run_ranks(2, [str(script), ending], timeout=120)


# Each rank writes its pid and sleeps, in a session of its own on rank 1 (as torchrun's workers).
SLEEPER = """
import os, sys, time
if os.environ["RANK"] == "1":
    os.setsid()
open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").write(str(os.getpid()))
time.sleep(600)
"""


def test_a_run_past_its_timeout_is_killed_with_its_ranks(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    start = time.monotonic()
    with pytest.raises(AssertionError, match="timed out after 10s"):
        run_ranks(2, [str(script), str(tmp_path)], timeout=10)
    assert time.monotonic() - start < 30
    time.sleep(0.5)
    for rank in ("0", "1"):
        pid = int((tmp_path / rank).read_text())
        assert not running(pid), f"rank {rank} (pid {pid}) outlived the timeout"


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed rank whose parent was killed too waits for init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_a_rank_that_aborts_raises_rank_aborted(tmp_path):
    with pytest.raises(RankAborted, match="SIGABRT"):
        launch_ending(tmp_path, "abort")


def test_a_rank_that_segfaults_raises_rank_aborted_with_its_stacks(tmp_path):
    with pytest.raises(RankAborted, match="SIGSEGV") as failure:
        launch_ending(tmp_path, "segfault")
    message = str(failure.value)
    assert "--- rank 1 log ---\nFatal Python error: Segmentation fault" in message, message[-2000:]
    assert "Current thread" in message and "ending.py" in message, message[-2000:]


def test_a_rank_that_exits_with_an_error_is_an_ordinary_failure(tmp_path):
    with pytest.raises(AssertionError) as failure:
        launch_ending(tmp_path, "exit")
    assert not isinstance(failure.value, RankAborted), failure.value


def test_failed_trainer_launch_shows_each_ranks_stderr():
    with pytest.raises(AssertionError) as failure:
        run_trainer(2, ["--training.steps=-1"], timeout=120)
    message = str(failure.value)
    for rank in (0, 1):
        assert f"--- rank {rank} log ---" in message, message[-2000:]
    assert message.count("--training.steps must be positive") >= 2, message[-2000:]
    assert sys.executable in message


def test_a_killed_rank_stops_the_others_and_is_named(monkeypatch):
    # Rank 1 is SIGKILLed at step 2; rank 0 would otherwise wait for it in a collective until
    # gloo's timeout (300 s).
    monkeypatch.setenv("TORCHTITAN_FAULT", "kill:rank=1:step=2")
    start = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        run_trainer(2, ["--training.steps=4", "--training.seq_len=64"], timeout=120)
    assert not isinstance(failure.value, RankAborted), failure.value
    assert "rank 1 failed (SIGKILL)" in str(failure.value), str(failure.value)[-2000:]
    assert time.monotonic() - start < 60
