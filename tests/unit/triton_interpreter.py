"""Triton kernels on CPU: a snippet run in a process of its own under Triton's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_under_interpreter(code: str, timeout: int = 300) -> str:
    """Run ``code`` with ``TRITON_INTERPRET=1`` (read when a kernel is defined, hence a fresh
    process) and the repository importable; -> its stdout. A failure fails the calling test with
    the snippet's stderr."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout
