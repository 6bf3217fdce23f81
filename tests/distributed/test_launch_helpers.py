"""The launch helpers tell a rank's C++ abort (the only failure tests/distributed reruns) from
any other failure, a failed trainer launch shows every rank's last words, and a rank that dies
stops the others."""

import sys
import time

import pytest

from tests.distributed.launch import RankAborted, run_ranks, run_trainer

# Rank 1 ends the way its argument says; rank 0 exits cleanly.
ENDING = """
import os, sys
if os.environ["RANK"] == "1":
    os.abort() if sys.argv[1] == "abort" else sys.exit(3)
"""


def launch_ending(tmp_path, ending: str) -> None:
    script = tmp_path / "ending.py"
    script.write_text(ENDING)
    run_ranks(2, [str(script), ending], timeout=120)


def test_a_rank_that_aborts_raises_rank_aborted(tmp_path):
    with pytest.raises(RankAborted, match="SIGABRT"):
        launch_ending(tmp_path, "abort")


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
