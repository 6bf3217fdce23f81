"""run_train.sh (through torchtitan.launch) and the trainer as a user meets them on CPU: a failure
ends in one line, Ctrl-C saves (twice: stops at once), relative paths mean the caller's
directory, and Flight Recorder dumps only for communication failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed.launch import (
    FORK_CLIENT,
    FORK_RANKS,
    ROOT,
    TINY_JOB,
    kill_tree,
    read_metrics,
)
from tests.reaper import descendants, running, sigkill_groups
from torchtitan import run_lock

RUN_TRAIN = ROOT / "run_train.sh"
JOB = [
    *[a for a in TINY_JOB if not a.startswith("--training.steps")],
    "--training.steps=10",
    "--training.local_batch_size=4",
]
CHECKPOINTS = ["--checkpoint.enable", "--checkpoint.interval=100"]


def start(cmd: list[str], log: Path, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """``cmd`` in its own session (a terminal's foreground group), output to ``log``."""
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT),  # the plain trainer process; run_train.sh sets it itself
        **env,
    }
    with open(log, "w") as out:
        return subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def finish(proc: subprocess.Popen, log: Path, timeout: float = 240) -> tuple[int, list[str]]:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"timed out:\n{log.read_text()[-3000:]}") from None
    finally:
        kill_tree(proc)
    return proc.returncode, log.read_text().splitlines()


def run(cmd, tmp_path: Path, cwd: Path | None = None, **env) -> tuple[int, list[str]]:
    log = tmp_path / f"log-{time.monotonic_ns()}.txt"
    return finish(start(cmd, log, cwd or tmp_path, env), log)


def wait_for(text: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def ctrl_c(proc: subprocess.Popen) -> None:
    """What a terminal does: SIGINT to the whole foreground process group."""
    os.killpg(proc.pid, signal.SIGINT)


def dumps(dump_folder: Path) -> list[str]:
    traces = dump_folder / "comm_traces"
    return sorted(p.name for p in traces.iterdir()) if traces.is_dir() else []


def no_traceback(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert "Traceback" not in text and "ChildFailedError" not in text, text[-4000:]


# --------------------------------------------------------------------------- Ctrl-C


def trainer(nproc: int | None, dump_folder: Path) -> list[str]:
    """The job under run_train.sh (``nproc`` ranks), or one plain process (None) with a loader
    worker process: in a terminal's process group, the worker gets the Ctrl-C too."""
    args = [*JOB, *CHECKPOINTS, f"--job.dump_folder={dump_folder}"]
    if nproc is None:
        return [sys.executable, "-m", "torchtitan.train", *args, "--training.data_workers=1"]
    return [str(RUN_TRAIN), *args]


# Two ranks through run_train.sh in the slow tier: the launcher's signal forwarding is also
# run by test_ranks_stop_when_their_launcher_is_killed and test_killed_test_run.py.
@pytest.mark.parametrize(
    "nproc",
    [None, pytest.param(2, marks=pytest.mark.slow)],
    ids=["one-process", "run_train.sh-2-ranks"],
)
def test_ctrl_c_saves_after_the_step_and_stops(tmp_path, nproc):
    """Ctrl-C during step 3 (slowed by a delay fault): every rank finishes step 3, step 3 is
    saved, the job exits 130 and its last line says so, without a traceback."""
    log = tmp_path / "log.txt"
    env = {"NGPU": str(nproc or 1), "TORCHTITAN_FAULT": "delay:step=3:seconds=6"}
    proc = start(trainer(nproc, tmp_path / "out"), log, tmp_path, env)
    wait_for("fault injection: delay", proc, log)
    ctrl_c(proc)
    rc, lines = finish(proc, log)
    assert rc == 130, "\n".join(lines[-30:])
    stop = "Ctrl-C: stopping after step 3 (checkpoint step-3 saved)"
    # Under the launcher: the line of the rank that stopped first (all ranks stopped alike).
    last = lines[-1].split(": ", 1)[1] if nproc else lines[-1].split(" WARNING ", 1)[1]
    assert last == stop, lines[-5:]
    no_traceback(lines)
    assert (tmp_path / "out" / "checkpoint" / "step-3").is_dir()
    assert dumps(tmp_path / "out") == []
    assert [r["step"] for r in read_metrics(tmp_path / "out")] == [1, 2, 3]


@pytest.mark.slow
# Two ranks through run_train.sh in the slow tier: the launcher's signal forwarding is also
# run by test_ranks_stop_when_their_launcher_is_killed and test_killed_test_run.py.
@pytest.mark.parametrize(
    "nproc",
    [None, pytest.param(2, marks=pytest.mark.slow)],
    ids=["one-process", "run_train.sh-2-ranks"],
)
def test_second_ctrl_c_stops_at_once_without_saving(tmp_path, nproc):
    log = tmp_path / "log.txt"
    env = {"NGPU": str(nproc or 1), "TORCHTITAN_FAULT": "delay:step=3:seconds=60"}
    proc = start(trainer(nproc, tmp_path / "out"), log, tmp_path, env)
    wait_for("fault injection: delay", proc, log)
    ctrl_c(proc)
    wait_for("Ctrl-C again stops at once", proc, log)
    pressed = time.monotonic()
    ctrl_c(proc)
    rc, lines = finish(proc, log)
    assert rc == 130 and time.monotonic() - pressed < 30, "\n".join(lines[-30:])
    assert lines[-1].endswith("Ctrl-C: stopped at once during step 3; not saved"), lines[-5:]
    no_traceback(lines)
    assert not (tmp_path / "out" / "checkpoint" / "step-3").exists()
    assert dumps(tmp_path / "out") == []


# --------------------------------------------------------------------------- one line at the end


@pytest.mark.parametrize(
    "args, fault, code, error",
    [
        (
            ["--checkpoint.enable", "--checkpoint.load_step=7"],
            "",
            2,
            "error: --checkpoint.load_step 7",
        ),
        # Slow tier: test_faults.py's nan_loss rows stop the same way, in one process.
        pytest.param(
            [],
            "nan_loss:step=2",
            3,
            "error: non-finite loss (nan) and grad_norm (nan) at step 2",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["missing-load-step", "non-finite"],
)
def test_a_failed_job_ends_with_its_error_and_no_dump(tmp_path, args, fault, code, error):
    """A one-process job under torchrun: the error is the last line (after torchrun's own),
    the line before says where every rank's log is, no traceback, no Flight Recorder dump."""
    out = tmp_path / "out"
    rc, lines = run(
        [str(RUN_TRAIN), *JOB, *args, f"--job.dump_folder={out}"],
        tmp_path,
        NGPU="1",
        TORCHTITAN_FAULT=fault,
    )
    assert rc == code, "\n".join(lines[-30:])
    assert lines[-1].startswith(error), lines[-5:]
    assert lines[-2].startswith(f"logs of every rank: {out}/logs/"), lines[-5:]
    rank_logs = Path(lines[-2].split(": ", 1)[1].split("<local rank>")[0]) / "0"
    assert error in (rank_logs / "stderr.log").read_text()
    no_traceback(lines)
    assert dumps(out) == []


# --------------------------------------------------------------------------- paths


@pytest.mark.slow
def test_run_train_sh_from_another_directory_reads_and_writes_there(tmp_path):
    """Relative paths mean the caller's directory; the bundled config and tokenizer still load."""
    here = tmp_path / "elsewhere"
    (here / "data").mkdir(parents=True)
    sample = (ROOT / "torchtitan" / "assets" / "sample_corpus.jsonl").read_text().splitlines()
    (here / "data" / "docs.jsonl").write_text("\n".join(sample[:40]) + "\n")
    common = [*JOB, "--training.steps=2", "--job.dump_folder=out", "--metrics.log_freq=1"]
    rc, lines = run(
        [str(RUN_TRAIN), *common, "--training.dataset=data/docs.jsonl"], tmp_path, here, NGPU="1"
    )
    assert rc == 0, "\n".join(lines[-30:])
    assert [r["step"] for r in read_metrics(here / "out") if "loss" in r] == [1, 2]
    assert list((here / "out" / "logs").glob("*/*/attempt_0/0/stdout.log"))
    assert not (ROOT / "out").exists()

    rc, lines = run([str(RUN_TRAIN), "--training.dataset=data/nope.jsonl"], tmp_path, here)
    assert rc == 2 and lines[-1] == (
        f"error: dataset path not found: {here}/data/nope.jsonl (from 'data/nope.jsonl')"
    )
    rc, lines = run([str(RUN_TRAIN)], tmp_path, here, CONFIG_FILE="train_configs/debug_model.toml")
    assert rc == 2 and lines[-1] == (
        f"error: config file not found: {here}/train_configs/debug_model.toml (from "
        "'train_configs/debug_model.toml'); the bundled one is "
        f"{ROOT}/train_configs/debug_model.toml"
    )


# --------------------------------------------------------------------------- processes and folders


def step_folders(dump_folder: Path) -> list[str]:
    folder = dump_folder / "checkpoint"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_ranks_stop_when_their_launcher_is_killed(tmp_path):
    """`kill -KILL -<pgid>` of a setsid'd run_train.sh kills torchrun's agent alone (the ranks
    run in sessions of their own): each rank sees its parent gone and stops within 10 s, starts
    no further checkpoint, and says why in its log. Step 6 is slowed so that an orphan would
    still be running (and saving every step) when the test looks."""
    out, log = tmp_path / "out", tmp_path / "log.txt"
    args = [*JOB, "--training.steps=40", "--checkpoint.enable", "--checkpoint.interval=1"]
    env = {"NGPU": "2", "TORCHTITAN_FAULT": "delay:step=6:seconds=30"}
    proc = start([str(RUN_TRAIN), *args, f"--job.dump_folder={out}"], log, tmp_path, env)
    ranks = []
    try:
        wait_for("fault injection: delay", proc, log)
        ranks = [p for p in descendants(proc.pid) if "torchtitan.train" in cmdline(p)]
        assert len(ranks) == 2, [cmdline(p) for p in descendants(proc.pid)]
        before = step_folders(out)
        os.killpg(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        while any(running(p) for p in ranks) and time.monotonic() - killed < 10:
            time.sleep(0.1)
        assert not any(running(p) for p in ranks), "a rank outlived its launcher by 10 s"
    finally:
        kill_tree(proc)
        sigkill_groups(ranks)
    time.sleep(1)
    assert step_folders(out) == before == [f"step-{s}" for s in range(1, 6)], before
    rank_log = next(out.glob("logs/*/*/attempt_0/0/stderr.log")).read_text()
    assert "the launcher (pid" in rank_log and "is gone: stopping now" in rank_log, rank_log[-2000:]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def test_a_second_run_in_the_same_folder_exits_2_naming_the_holder(tmp_path):
    """The folder's lock is held (by this test, as by a first run): under the launcher the second
    run ends before torchrun starts anything and writes nothing; as two ranks without a
    launcher, rank 0 finds the folder taken and every rank ends with its line (the ranks only
    create the Flight Recorder's folder, empty, before they hear rank 0's verdict)."""
    out = tmp_path / "out"
    with run_lock.acquire(out) as held:
        holder = run_lock.Holder.parse(held.path.read_text())
        line = (
            f"error: job.dump_folder {out} is in use by another run ({holder.describe()}); wait "
            "for it to end, stop it, or pass another --job.dump_folder"
        )
        launch = [sys.executable, "-m", "torchtitan.launch", "--standalone", "--nproc_per_node=2"]
        rc, lines = run(
            [*launch, "-m", "torchtitan.train", *JOB, f"--job.dump_folder={out}"], tmp_path
        )
        assert (rc, lines[-1]) == (2, line), lines[-5:]
        assert sorted(p.name for p in out.iterdir()) == [run_lock.LOCK_NAME]
        logs = tmp_path / "ranks"
        ranks = [str(FORK_RANKS), "2", str(logs), "-m", "torchtitan.train", *JOB]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        rc, _ = FORK_CLIENT.run([*ranks, f"--job.dump_folder={out}"], env, str(ROOT), 120)
        assert rc == 2
        for rank in (0, 1):
            assert (logs / f"rank_{rank}.log").read_text().splitlines()[-1].endswith(line)
    # The Flight Recorder's folder may be made before a rank hears the verdict; nothing is
    # written into it.
    assert {p.name for p in out.iterdir()} - {"comm_traces"} == {run_lock.LOCK_NAME}
    assert not (out / "comm_traces").exists() or not any((out / "comm_traces").iterdir())
