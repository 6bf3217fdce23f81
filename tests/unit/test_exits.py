"""How a rank ends (torchtitan/exits.py), how the launcher picks the line it shows last
(torchtitan/launch.py), Ctrl-C in the PreemptionGuard (torchtitan/runtime.py), and a clean exit
after success."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from torchtitan import exits, launch, runtime
from torchtitan.config import ConfigError
from torchtitan.data.text import DataError
from torchtitan.observability import flight_recorder as fr
from torchtitan.observability.numerics import NonFiniteError

GLOO_TIMEOUT = RuntimeError(
    "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
    "5000ms for recv operation to complete"
)


@pytest.mark.parametrize(
    "error, code, line, kind",
    [
        (ConfigError("bad key"), 2, "error: bad key", "error"),
        (DataError("bad file"), 2, "error: bad file", "error"),
        (NonFiniteError("non-finite loss (nan) at step 4"), 3, "error: non-finite", "error"),
        (GLOO_TIMEOUT, 4, "error: communication failed: RuntimeError: [/pytorch", "communication"),
        (KeyboardInterrupt(), 130, "Ctrl-C: stopped at once during step 7; not saved", "stopped"),
        (runtime.Preempted(3, signal.SIGINT, "Ctrl-C: stop"), 130, "Ctrl-C: stop", "stopped"),
        (runtime.Preempted(3, signal.SIGTERM, "SIGTERM: stop"), 143, "SIGTERM: stop", "stopped"),
        (runtime.Preempted(-1, signal.SIGTERM, "gone"), 143, "gone", "communication"),
        (ValueError("oops\nmore"), 1, "error: ValueError: oops (unexpected;", "error"),
    ],
)
def test_every_ending_is_one_line_with_its_code(error, code, line, kind):
    ending = exits.classify(error, step=7)
    assert (ending.code, ending.kind) == (code, kind)
    assert ending.line.startswith(line) and "\n" not in ending.line


def test_help_and_clean_exits_are_not_endings():
    assert exits.classify(SystemExit(0), step=None) is None
    assert exits.classify(KeyboardInterrupt(), step=None).line.endswith("before training started")


def test_communication_failure_names_the_hang_report(tmp_path):
    assert "hang_report" not in exits.classify(GLOO_TIMEOUT, 3, tmp_path).line  # no dumps
    (tmp_path / "rank_0").write_bytes(b"")
    line = exits.classify(GLOO_TIMEOUT, 3, tmp_path).line
    assert line.endswith(f"python -m torchtitan.observability.hang_report {tmp_path}")


def test_finish_writes_what_torchrun_reads(tmp_path, monkeypatch):
    """The error file is torchrun's format: its ProcessFailure reads our line as the message."""
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("RANK", "1")
    assert exits.finish(DataError("x.jsonl, line 2: not valid JSON"), step=None) == 2
    failure = ProcessFailure(local_rank=1, pid=1, exitcode=2, error_file=str(error_file))
    assert failure.message == "error: x.jsonl, line 2: not valid JSON"
    assert abs(failure.timestamp - time.time()) < 5
    ending = launch.from_failure(1, failure)
    assert (ending.rank, ending.code, ending.kind) == (1, 2, "error")
    assert ending.log_folder == tmp_path
    # A bug: the file is written, the caller re-raises (Python prints the traceback).
    assert exits.finish(ValueError("oops"), step=3) is None
    assert "ValueError: oops" in json.loads(error_file.read_text())["message"]


def test_without_torchrun_no_file_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    assert exits.write_error_file(exits.Ending(2, "error: x", "error")) is None


def _ending(rank, kind, t, code=1):
    return launch.RankEnding(rank, code, f"{kind} on {rank}", kind, t, None)


def test_launcher_shows_the_cause_before_its_consequences():
    # rank 0 timed out first, rank 1 had the real error (a killed rank counts as one), rank 2
    # was stopped by torchrun's SIGTERM.
    endings = [
        _ending(0, "communication", 1.0),
        _ending(1, "error", 2.0),
        _ending(2, "stopped", 0.5),
    ]
    assert launch.most_telling(endings).rank == 1
    assert launch.most_telling([_ending(0, "stopped", 2.0), _ending(1, "stopped", 1.0)]).rank == 1
    assert launch.most_telling([]) is None


def test_launcher_explains_a_rank_killed_without_a_word(tmp_path):
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=-9, error_file=str(tmp_path / "none"))
    ending = launch.from_failure(3, failure)
    assert ending.kind == "error" and "killed by SIGKILL" in ending.line
    lines = launch.summary(ending, several_ranks=True, log_dir=tmp_path)
    assert lines == [f"logs of every rank: {tmp_path}/", f"rank 3: {ending.line}"]


def test_launcher_reads_error_files_of_this_launch_only(tmp_path):
    old, new = tmp_path / "a" / "attempt_0" / "0", tmp_path / "a" / "attempt_0" / "1"
    for folder, rank in ((old, 0), (new, 1)):
        folder.mkdir(parents=True)
        details = {"rank": rank, "code": 130, "line": f"r{rank}", "kind": "stopped", "time": 1.0}
        (folder / "error.json").write_text(json.dumps({"message": "m", "torchtitan": details}))
    os.utime(old / "error.json", (1, 1))  # written before the launch started
    endings = launch.from_error_files(tmp_path, since=time.time() - 60)
    assert [(e.rank, e.line, e.log_folder) for e in endings] == [(1, "r1", new)]


def test_launcher_gives_the_ranks_time_to_save_unless_told_otherwise(monkeypatch):
    """torchrun's default 30 s from the forwarded signal to SIGKILL would kill a large save:
    the launcher raises it where torch has the option, unless the flag or an env var set it."""
    from torch.distributed import run as torchrun

    captured = []
    monkeypatch.setattr(torchrun, "run", captured.append)
    monkeypatch.delenv(launch.SHUTDOWN_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv("PET_SHUTDOWN_TIMEOUT", raising=False)
    script = ["--standalone", "--nproc_per_node=1", "train.py"]
    assert launch.main(script) == 0
    if not hasattr(captured[0], "shutdown_timeout"):  # torch < 2.12: torchrun's fixed 30 s
        pytest.skip("this torch's torchrun has no --shutdown-timeout")
    assert captured[0].shutdown_timeout == launch.SHUTDOWN_TIMEOUT
    assert torchrun.config_from_args(captured[0])[0].shutdown_timeout == launch.SHUTDOWN_TIMEOUT

    assert launch.main(["--shutdown-timeout=45", *script]) == 0
    assert captured[-1].shutdown_timeout == 45
    monkeypatch.setenv("PET_SHUTDOWN_TIMEOUT", "50")  # torchrun's env form of the flag
    assert launch.main(script) == 0
    assert captured[-1].shutdown_timeout == 50
    monkeypatch.delenv("PET_SHUTDOWN_TIMEOUT")
    monkeypatch.setenv(launch.SHUTDOWN_TIMEOUT_ENV, "60")  # read by torch's LaunchConfig
    assert launch.main(script) == 0
    assert captured[-1].shutdown_timeout is None
    assert torchrun.config_from_args(captured[-1])[0].shutdown_timeout == 60


def test_launcher_leaves_a_torch_without_the_option_alone():
    args = argparse.Namespace()
    launch.allow_time_to_save(args, environ={})
    assert vars(args) == {}


def test_communication_failures_are_told_apart():
    assert fr.is_communication_failure(GLOO_TIMEOUT)
    assert fr.is_communication_failure(RuntimeError("... Connection closed by peer [1.2.3.4]:5"))
    assert fr.is_communication_failure(fr.Terminated(signal.SIGTERM))
    for error in (ValueError("gloo"), NonFiniteError("nan"), KeyboardInterrupt(), DataError("x")):
        assert not fr.is_communication_failure(error)
    assert runtime.needs_flight_recorder_dump(runtime.Preempted(-1))
    assert not runtime.needs_flight_recorder_dump(runtime.Preempted(5, signal.SIGINT))
    assert not runtime.needs_flight_recorder_dump(RuntimeError("injected crash at step 5"))


def _signal_self(signum):
    os.kill(os.getpid(), signum)
    for _ in range(1000):  # the handler runs between bytecodes
        pass


def test_ctrl_c_asks_to_stop_and_a_second_one_stops_at_once():
    before = signal.getsignal(signal.SIGINT)
    with runtime.PreemptionGuard(60) as guard:
        assert guard.requested() == 0
        _signal_self(signal.SIGINT)
        assert guard.requested() == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_sigterm_wins_and_ctrl_c_after_it_stops_at_once():
    with runtime.PreemptionGuard(60) as guard:
        _signal_self(signal.SIGTERM)
        _signal_self(signal.SIGTERM)  # repeated: still a request
        assert guard.requested() == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signal.SIGINT)
    assert runtime.Preempted(3, signal.SIGTERM).code == 143
    assert runtime.Preempted(3, signal.SIGINT).code == 130


# ------------------------------------------------------- the grace of the stop vote (one rank)

GRACE = 0.3  # PreemptionGuard.GRACE_SECONDS in these tests (20 s in a job)


@pytest.fixture
def one_rank_group(tmp_path, monkeypatch):
    """A process group of one rank (gloo), so the guard votes and arms its watchdog."""
    monkeypatch.setattr(runtime.PreemptionGuard, "GRACE_SECONDS", GRACE)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_step_longer_than_the_grace_after_the_signal_still_stops_cleanly(one_rank_group):
    """The grace bounds the vote, not the step: a step (or a save) still running GRACE_SECONDS
    after SIGTERM is healthy work, and the vote after it agrees to stop."""
    with runtime.PreemptionGuard(60) as guard:
        assert guard.requested() == 0
        _signal_self(signal.SIGTERM)
        time.sleep(GRACE * 4)  # a slow step; a watchdog started by the signal would end it
        assert guard.requested() == signal.SIGTERM
        time.sleep(GRACE * 2)  # the save after the vote: no watchdog left either


def test_a_vote_that_does_not_complete_ends_the_rank_after_the_grace(one_rank_group, monkeypatch):
    def hung_vote(*args, **kwargs):
        time.sleep(60)  # a peer that is gone: the collective never completes

    with runtime.PreemptionGuard(60) as guard:
        _signal_self(signal.SIGTERM)
        monkeypatch.setattr(runtime.dist, "all_reduce", hung_vote)
        begin = time.monotonic()
        with pytest.raises(runtime.Preempted) as stopped:
            guard.requested()
    assert time.monotonic() - begin < GRACE + 5
    assert stopped.value.step == -1 and stopped.value.code == 143
    assert str(stopped.value) == (
        f"SIGTERM: the ranks did not agree to stop within {GRACE} s (another rank is gone or "
        "hung); not saved"
    )


def test_a_step_after_another_rank_of_the_node_died_ends_after_the_grace(
    one_rank_group, monkeypatch
):
    """torchrun SIGTERMs the ranks when one failed and SIGKILLs them 30 s later: a rank still in
    its step GRACE_SECONDS after that SIGTERM stops (and dumps) itself, before the SIGKILL."""
    running = iter([2, 1])  # this node's ranks at the guard's start, then when the grace ends
    count = staticmethod(lambda: next(running))
    monkeypatch.setattr(runtime.PreemptionGuard, "_running_node_ranks", count)
    with runtime.PreemptionGuard(60):
        _signal_self(signal.SIGTERM)
        with pytest.raises(runtime.Preempted) as stopped:
            time.sleep(GRACE * 20)  # a stalled step
    assert stopped.value.step == -1 and stopped.value.code == 143
    assert str(stopped.value) == (
        f"SIGTERM: another rank of this node is gone and this step did not finish within {GRACE} "
        "s; not saved"
    )


def test_a_trainer_step_longer_than_the_grace_is_saved(tmp_path, monkeypatch):
    """The trainer with a process group (one rank): SIGTERM during step 3, which takes longer
    than the grace: step 3 is saved and the run stops with Preempted(3)."""
    from tests.unit.test_train import make_trainer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for key, value in {**env, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(runtime.PreemptionGuard, "GRACE_SECONDS", GRACE)
    trainer = make_trainer(tmp_path, "--checkpoint.enable", "--checkpoint.interval=100")
    step = trainer.train_step

    def slow_step(data_iter):
        if trainer.step == 3:
            _signal_self(signal.SIGTERM)
            time.sleep(GRACE * 4)
        return step(data_iter)

    monkeypatch.setattr(trainer, "train_step", slow_step)
    try:
        assert dist.is_initialized()
        with pytest.raises(runtime.Preempted) as stopped:
            trainer.train()
    finally:
        trainer.close()
    assert stopped.value.step == 3 and stopped.value.code == 143
    assert str(stopped.value) == "SIGTERM: stopping after step 3 (checkpoint step-3 saved)"
    assert (tmp_path / "checkpoint" / "step-3").is_dir()


def test_paths_in_errors_are_absolute(tmp_path, monkeypatch):
    from torchtitan.paths import shown

    monkeypatch.chdir(tmp_path)
    assert shown("data/x.jsonl") == f"{tmp_path}/data/x.jsonl (from 'data/x.jsonl')"
    assert shown(str(tmp_path / "x")) == str(tmp_path / "x")
    assert shown(Path("~/x")).startswith(str(Path.home()))


def test_a_command_that_succeeded_exits_without_noise():
    """Nothing on stderr after a successful command's own output. Freezing the heap before the
    exit (to skip the final garbage collection, as the entry points once did) kept Triton's
    objects alive past its extension's teardown, which then listed each as a leak: about 600
    lines after every successful run on CPU with Triton 3.9."""
    done = subprocess.run(
        [sys.executable, "-m", "torchtitan.plan", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.startswith("usage:")
    assert done.stderr == ""
