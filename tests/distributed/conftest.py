import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.launch import ROOT, TINY_JOB, curves

HERE = Path(__file__).parent


def pytest_configure(config):
    """A rerun's first failure is printed in the summary: it says why the rank aborted."""
    if hasattr(config.option, "rerun_show_tracebacks"):
        config.option.rerun_show_tracebacks = True


def pytest_collection_modifyitems(items):
    """Rerun a test here once if, and only if, it failed with ``RankAborted`` (a rank died of
    SIGABRT or SIGSEGV in torch's C++, see launch.py); any other failure fails at once."""
    rerun = pytest.mark.flaky(reruns=1, only_rerun=["^RankAborted:"])
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(rerun)


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
