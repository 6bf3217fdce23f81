"""The torchrun test helpers tell a rank's C++ abort (the only failure tests/distributed reruns)
from any other failure, and a failed trainer launch shows every rank's last words."""

import sys

import pytest

from tests.distributed.launch import RankAborted, run_checked, torchrun, torchrun_cmd

# Rank 1 ends the way its argument says; rank 0 exits cleanly.
ENDING = """
import os, sys
if os.environ["RANK"] == "1":
    os.abort() if sys.argv[1] == "abort" else sys.exit(3)
"""


def launch_ending(tmp_path, ending: str) -> None:
    script = tmp_path / "ending.py"
    script.write_text(ENDING)
    run_checked([*torchrun_cmd(2), str(script), ending], timeout=120)


def test_a_rank_that_aborts_raises_rank_aborted(tmp_path):
    with pytest.raises(RankAborted, match="SIGABRT"):
        launch_ending(tmp_path, "abort")


def test_a_rank_that_exits_with_an_error_is_an_ordinary_failure(tmp_path):
    with pytest.raises(AssertionError) as failure:
        launch_ending(tmp_path, "exit")
    assert not isinstance(failure.value, RankAborted), failure.value


def test_failed_trainer_launch_shows_each_ranks_stderr():
    with pytest.raises(AssertionError) as failure:
        torchrun(2, ["--training.steps=-1"], timeout=120)
    message = str(failure.value)
    for rank in (0, 1):
        assert f"--- rank {rank} stderr ---" in message, message[-2000:]
    assert message.count("--training.steps must be positive") >= 2, message[-2000:]
    assert sys.executable in message
