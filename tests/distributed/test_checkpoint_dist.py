"""DCP checkpoints across layouts: saved under FSDP4, resumed under FSDP2 x TP2 (4 gloo ranks).

One launch runs tests/distributed/checkpoint_worker.py, which asserts on every rank that the
full model and optimizer states, the lr, the train state and the next global batch survive the
resharding, that a truncated shard makes all ranks fall back to the previous step together,
and that one rank running out of disk space ends the save on every rank in the same line.
"""

import sys

import pytest

from tests.distributed.launch import ROOT, start, wait_all

WORKER = ROOT / "tests" / "distributed" / "checkpoint_worker.py"


@pytest.mark.slow  # test_resume.py resumes under other layouts in make test
def test_fsdp4_checkpoint_resumes_under_fsdp2_tp2(tmp_path):
    log = tmp_path / "worker.log"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=4",
        str(WORKER),
        str(tmp_path / "dump"),
    ]
    # PYTHONPATH: this checkout's torchtitan, not an installed one
    proc = start(cmd, log, env={"PYTHONPATH": str(ROOT)})
    wait_all([proc], [log], timeout=240)
    out = log.read_text()
    assert "CHECKPOINT-DIST OK" in out, out[-3000:]
    assert "checkpoint step-2 could not be loaded" in out, out[-3000:]
    assert "falling back to step-1" in out, out[-3000:]
