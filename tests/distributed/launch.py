"""Run the trainer under torchrun on CPU/gloo and read back its per-step metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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


def torchrun(nproc: int, args: list[str], timeout: int = 300, nnodes_args=None) -> str:
    """Launch ``python -m torchtitan.train`` on ``nproc`` CPU processes; returns the output.

    The whole process group is killed on timeout, so a hung rank cannot outlive the test.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    launcher = nnodes_args or ["--standalone"]
    cmd = [sys.executable, "-m", "torch.distributed.run", *launcher, f"--nproc_per_node={nproc}"]
    cmd += ["--local-ranks-filter=0", "-m", "torchtitan.train", *args]
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
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"torchrun timed out after {timeout}s:\n{out[-3000:]}") from None
    if proc.returncode != 0:
        raise AssertionError(f"torchrun failed (rc={proc.returncode}):\n{out[-5000:]}")
    return out


def read_metrics(dump_folder: Path) -> list[dict]:
    files = sorted((dump_folder / "metrics").glob("*.jsonl"))
    assert len(files) == 1, f"expected one metrics file in {dump_folder}, found {files}"
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def curves(dump_folder: Path) -> tuple[list[float], list[float]]:
    rows = read_metrics(dump_folder)
    return [r["loss"] for r in rows], [r["grad_norm"] for r in rows]
