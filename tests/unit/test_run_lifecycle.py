"""One run per dump folder (``run_lock``), the rank's watch on its launcher, the one config line
at launch, and the fault points inside a checkpoint save."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from torchtitan import run_lock, runtime
from torchtitan.config import ConfigError, JobConfig, parse_args
from torchtitan.observability import fault_injection as fi

ROOT = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- run_lock


def test_the_lock_names_its_holder_and_a_second_taker_gets_one_line(tmp_path):
    with run_lock.acquire(tmp_path / "run") as lock:
        assert lock.note == ""
        holder = run_lock.Holder.parse(lock.path.read_text())
        assert (holder.pid, holder.host) == (os.getpid(), run_lock.Holder.this_process().host)
        # flock is per open file: a second open in this process conflicts like another run.
        with pytest.raises(run_lock.FolderInUse) as error:
            run_lock.acquire(tmp_path / "run")
    message = str(error.value)
    assert "\n" not in message and isinstance(error.value, ConfigError)
    assert message == (
        f"job.dump_folder {tmp_path / 'run'} is in use by another run ({holder.describe()}); "
        "wait for it to end, stop it, or pass another --job.dump_folder"
    )
    assert lock.path.read_text() == ""  # released: nobody is named
    with run_lock.acquire(tmp_path / "run") as again:
        assert again.note == ""


HOLD_AND_DIE = """
import os, signal, sys, time
from torchtitan import run_lock
lock = run_lock.acquire(sys.argv[1])
child = os.fork()
if child == 0:  # like a data loader worker: outlives its parent for a while
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_lock_whose_holder_was_killed_is_taken_over_with_a_note(tmp_path):
    """The holder is SIGKILLed while a child it forked lives on: the lock is free (the child
    dropped its copy at the fork) and the next run takes it over, naming the dead holder."""
    proc = subprocess.run(
        [sys.executable, "-c", HOLD_AND_DIE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child = int(proc.stdout.split()[0])
    try:
        dead = run_lock.Holder.parse((tmp_path / run_lock.LOCK_NAME).read_text())
        assert proc.returncode == -signal.SIGKILL and dead is not None
        with run_lock.acquire(tmp_path) as lock:
            assert lock.note == (
                f"job.dump_folder {tmp_path}: taking over the lock of a run that ended without "
                f"releasing it ({dead.describe()})"
            )
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_folder_that_cannot_be_created_is_one_line():
    with pytest.raises(ConfigError, match=r"^job.dump_folder /proc/x cannot be used: "):
        run_lock.acquire("/proc/x")


def test_a_filesystem_without_locks_runs_unlocked(tmp_path, monkeypatch):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    assert run_lock.acquire(tmp_path) is None
    assert "has no file locks" in run_lock.unsupported_warning(tmp_path)


def test_ranks_skip_the_lock_their_launcher_holds(tmp_path, monkeypatch):
    assert not run_lock.held_by_launcher(tmp_path, environ={})
    env = {run_lock.HELD_ENV: str(run_lock.lock_path(tmp_path))}
    assert run_lock.held_by_launcher(tmp_path, environ=env)
    assert not run_lock.held_by_launcher(tmp_path / "other", environ=env)


def test_trainer_start_refuses_a_folder_in_use(tmp_path):
    cfg = parse_args([f"--job.dump_folder={tmp_path}", "--training.steps=1"])
    with run_lock.acquire(tmp_path):
        with pytest.raises(run_lock.FolderInUse, match="is in use by another run"):
            runtime.start_locked_job(cfg)
    assert not (tmp_path / "configs").exists()  # nothing written before the lock


# --------------------------------------------------------------------------- config line


def test_the_config_is_one_line_of_the_options_that_differ():
    assert runtime.config_changes(JobConfig()) == "every option at its default"
    cfg = parse_args(["--training.steps=7", "--checkpoint.enable", "--job.description=a b"])
    assert runtime.config_changes(cfg) == (
        'options that differ from the defaults: job.description="a b", training.steps=7, '
        "checkpoint.enable=true"
    )


def test_start_logs_where_the_config_is_and_what_differs(tmp_path, caplog):
    cfg = parse_args([f"--job.dump_folder={tmp_path}", "--training.steps=3"])
    with caplog.at_level(logging.INFO, logger="torchtitan"):
        job, run_id, lock = runtime.start_locked_job(cfg)
    runtime.shutdown_process(lock)
    lines = [r.getMessage() for r in caplog.records if "config" in r.getMessage()]
    saved = tmp_path / "configs" / f"{run_id}.toml"
    assert lines == [
        f"config saved to {saved}; options that differ from the defaults: "
        f'job.dump_folder="{tmp_path}", training.steps=3'
    ]
    assert saved.is_file()


# --------------------------------------------------------------------------- launcher watch


def test_the_launcher_watch_is_armed_only_under_torchrun():
    """(tests/distributed/test_launch.py kills a real launcher.)"""
    assert not runtime.LauncherWatch(environ={}).armed
    assert runtime.LauncherWatch(environ={"TORCHELASTIC_RUN_ID": "x"}).armed


# --------------------------------------------------------------------------- fault points


def test_fault_points_parse_and_match():
    (fault,) = fi.parse("term:rank=1:step=4:at=saved")
    assert fault == fi.Fault("term", 4, 1, at="saved")
    assert fault.matches("term", 4, 1, "saved") and not fault.matches("term", 4, 1)
    with pytest.raises(ValueError, match="at must be one of step, save, saved"):
        fi.parse("kill:step=1:at=rename")
    with pytest.raises(ValueError, match="nan_loss takes"):
        fi.parse("nan_loss:step=1:at=save")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_save_points_fire_inside_a_checkpoint_write(tmp_path, monkeypatch, caplog, asynchronous):
    """``save`` fires when the writer starts (the folder exists, no .metadata yet), ``saved``
    when the write is complete and the folder not yet renamed."""
    monkeypatch.setattr(dcp, "save", dcp.save)  # restored after the test
    monkeypatch.setattr(dcp, "async_save", dcp.async_save)
    seen = []

    def spy(kind, step, rank, faults=None, at="step"):
        folder = tmp_path / f"step-{step}.tmp"
        seen.append((kind, at, (folder / ".metadata").exists()))
        return False

    injector = fi.FaultInjector(0, fi.parse("delay:step=3:seconds=0:at=save;kill:step=3:at=saved"))
    monkeypatch.setattr(fi, "maybe_inject", spy)
    state = {"w": torch.ones(4)}
    target = str(tmp_path / "step-3.tmp")
    if asynchronous:
        result = dcp.async_save(state, checkpoint_id=target, no_dist=True)
        getattr(result, "upload_completion", result).result()
    else:
        dcp.save(state, checkpoint_id=target, no_dist=True)
    deadline = time.monotonic() + 5  # a future's callbacks may run just after result() returns
    while len(seen) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert injector.faults
    assert [(at, meta) for kind, at, meta in seen if kind == "kill"] == [
        ("save", False),
        ("saved", True),
    ]
