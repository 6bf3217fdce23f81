"""scripts/layout_parity.sh: seed, reference and a layout from it, compared; bad input refused."""

import re
import subprocess

import pytest

from tests.distributed.launch import ROOT

SCRIPT = ROOT / "scripts" / "layout_parity.sh"
COMMON = [
    "--",
    "--training.steps=3",
    "--training.seq_len=64",
    "--training.global_batch_size=8",
    "--metrics.enable_tensorboard=false",
]


def run(*args, timeout=300) -> subprocess.CompletedProcess:
    env_cmd = ["env", "OMP_NUM_THREADS=1", "bash", str(SCRIPT), *map(str, args)]
    return subprocess.run(env_cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_fsdp2_reproduces_the_reference(tmp_path):
    out = run(tmp_path / "parity", "fsdp2:2:--training.local_batch_size 4", *COMMON)
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.search(r"fsdp2: max rel diff (\S+) at step", out.stdout)
    assert found, out.stdout
    assert float(found.group(1)) < 1e-5
    assert (tmp_path / "parity" / "seed" / "checkpoint" / "step-0").is_dir()


def test_existing_output_folder_is_refused_untouched(tmp_path):
    mine = tmp_path / "mine.txt"
    mine.write_text("keep")
    out = run(tmp_path, "fsdp2:2:", *COMMON)
    assert out.returncode == 2 and "exists" in out.stderr
    assert mine.read_text() == "keep" and sorted(tmp_path.iterdir()) == [mine]


def test_malformed_layout_is_refused(tmp_path):
    out = run(tmp_path / "new", "fsdp2", *COMMON)
    assert out.returncode == 2 and "NAME:NPROC:OVERRIDES" in out.stderr
    assert not (tmp_path / "new").exists()
