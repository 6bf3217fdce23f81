import subprocess
import sys

import pytest

from tests.distributed.launch import ROOT, TINY_JOB, curves


@pytest.fixture(scope="session")
def seed_checkpoint(tmp_path_factory) -> str:
    """Initial weights written once by one process; every layout starts from them."""
    folder = tmp_path_factory.mktemp("seed")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torchtitan.train",
            f"--job.dump_folder={folder}",
            "--checkpoint.create_seed_checkpoint",
            "--training.seq_len=64",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return str(folder / "checkpoint" / "step-0")


@pytest.fixture(scope="session")
def reference_curves(seed_checkpoint, tmp_path_factory):
    """Single-process fp32 loss and grad-norm curves (the parity reference)."""
    folder = tmp_path_factory.mktemp("reference")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torchtitan.train",
            *TINY_JOB,
            "--training.local_batch_size=8",
            f"--checkpoint.initial_load_path={seed_checkpoint}",
            f"--job.dump_folder={folder}",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return curves(folder)
