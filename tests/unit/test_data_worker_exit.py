"""The loader's worker process ends with the training process, and only then (data/worker.py).

Each test runs a small training-like process with a one-worker loader in its own session, as
torchrun starts ranks, and signals it as torchrun (the whole group) or a crash (the process only)
would.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Reads batches until SIGTERM, then three more (the rest of its step), then exits without closing
# the loader: the worker must survive torchrun's SIGTERM and still be stopped at exit.
# SIGUSR1 dumps every thread's stack, the worker's too (it is forked with the handler), so a
# hang shows where it is (see ``communicate``).
TRAINING_LIKE = """
import faulthandler, multiprocessing, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
# Ctrl-C raises KeyboardInterrupt, as in a terminal, even where the test runner was started with
# SIGINT ignored (a background job of a script: `make test &`), which this process would inherit.
signal.signal(signal.SIGINT, signal.default_int_handler)
from torchtitan.config import ASSETS
from torchtitan.data import Tokenizer, build_dataloader

tokenizer = Tokenizer(ASSETS / "tokenizer.model")
loader = build_dataloader("sample", tokenizer, 16, 2, 0, 1, num_workers=1)
batches = iter(loader)
next(batches)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
print("ready", *[p.pid for p in multiprocessing.active_children()], flush=True)
while not stop:
    next(batches)
    time.sleep(0.01)
for _ in range(3):
    next(batches)
print("finished", loader.windows, flush=True)
sys.exit(143)
"""


def start() -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", TRAINING_LIKE],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    words = process.stdout.readline().split()
    if words[:1] != ["ready"]:
        process.kill()
        pytest.fail(f"child did not start: {process.communicate()[1][-2000:]}")
    return process, [int(pid) for pid in words[1:]]


def communicate(process: subprocess.Popen, workers: list[int], timeout: float) -> tuple[str, str]:
    """``process.communicate``; on a timeout, fail with the stacks of the process and its workers
    (and each one's kernel wait channel) instead of a bare timeout."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        states = [f"{pid}: {proc_state(pid)}" for pid in (process.pid, *workers)]
        for pid in (process.pid, *workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(2)
        os.killpg(process.pid, signal.SIGKILL)
        _, err = process.communicate()
        pytest.fail(f"still running after {timeout} s ({'; '.join(states)}):\n{err[-8000:]}")


def stat_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, Z, ...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def proc_state(pid: int) -> str:
    state = stat_state(pid)
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text() or "-"
    except OSError:
        state = None
    return "gone" if state is None else f"state {state}, waiting in {wchan}"


def wait_exited(pid: int, seconds: float) -> str:
    """'gone' (reaped), 'zombie' (exited, its new parent has not reaped it) or 'running'."""
    deadline = time.monotonic() + seconds
    while True:
        state = stat_state(pid)
        if state is None:
            return "gone"
        if state == "Z":
            return "zombie"
        if time.monotonic() > deadline:
            return "running"
        time.sleep(0.1)


pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")


def test_worker_survives_group_sigterm_and_stops_at_exit():
    process, workers = start()
    assert len(workers) == 1
    os.killpg(process.pid, signal.SIGTERM)
    out, err = communicate(process, workers, timeout=60)
    assert process.returncode == 143, err[-2000:]
    assert "finished" in out
    assert wait_exited(workers[0], 10) == "gone"  # stopped and reaped by its parent


def test_ctrl_c_stops_training_and_worker():
    process, workers = start()
    os.killpg(process.pid, signal.SIGINT)
    _, err = communicate(process, workers, timeout=60)
    assert process.returncode == -signal.SIGINT, err[-2000:]  # Python's KeyboardInterrupt exit
    assert wait_exited(workers[0], 10) == "gone"


def test_worker_exits_when_training_process_is_killed():
    process, workers = start()
    process.kill()
    process.wait(timeout=60)
    # PyTorch's watchdog notices the missing parent within 5 s; the orphan is then its new
    # parent's to reap, so a zombie counts as exited.
    assert wait_exited(workers[0], 15) in ("gone", "zombie")
