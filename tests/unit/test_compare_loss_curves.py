"""scripts/compare_loss_curves.py: the worst relative difference and where it is."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "compare_loss_curves.py"


def write_run(folder: Path, losses: dict[int, float]) -> Path:
    (folder / "metrics").mkdir(parents=True)
    rows = [json.dumps({"step": s, "loss": loss}) for s, loss in losses.items()]
    (folder / "metrics" / "run.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def run(*folders: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, folders)], capture_output=True, text=True
    )


def test_reports_the_worst_step(tmp_path):
    ref = write_run(tmp_path / "ref", {1: 10.0, 2: 8.0, 3: 6.0})
    other = write_run(tmp_path / "other", {1: 10.0, 2: 8.08, 3: 6.03})
    out = run(ref, other)
    assert out.returncode == 0, out.stderr
    assert "max rel diff 1.0e-02 at step 2" in out.stdout


@pytest.mark.parametrize("losses", [{}, {7: 1.0}])
def test_no_shared_step_is_an_error(tmp_path, losses):
    ref = write_run(tmp_path / "ref", {1: 10.0})
    other = write_run(tmp_path / "other", losses)
    out = run(ref, other)
    assert out.returncode != 0
    assert "share no logged step" in out.stderr
