"""The fault soak (``scripts/fault_soak.py``), short: 12 kills in a row, then the run must end
exactly as an uninterrupted one. ``python scripts/fault_soak.py --cycles 100`` is the long one."""

from __future__ import annotations

import random
import sys

import pytest

from scripts import fault_soak
from tests.distributed.launch import ROOT, run_checked

CYCLES = 12


def test_the_first_cycles_cover_every_moment():
    """Seeded (CI is reproducible) and, within the first ten cycles, a kill and a SIGTERM at the
    start of a synchronous and of an asynchronous checkpoint write, between the write and the
    rename (both modes), at a step's start and at a random time."""
    faults, again = planned(0), planned(0)
    assert faults == again and len(faults) <= 10
    kinds = {(f.signal, f.at, f.asynchronous) for f in faults}
    for at in ("save", "saved"):
        for asynchronous in (False, True):
            assert any((s, at, asynchronous) in kinds for s in ("KILL", "TERM")), (at, kinds)
    assert {s for s, at, _ in kinds if at == "save"} == {"KILL", "TERM"}
    assert {s for s, at, _ in kinds if at == "time"} == {"KILL", "TERM"}
    assert all(f.spec().startswith(f.signal.lower()) for f in faults if f.at != "time")


def planned(seed: int) -> list[fault_soak.Fault]:
    rng = random.Random(seed)
    return [fault_soak.plan(rng, c, c, 100) for c in range(len(fault_soak.COVER))]


@pytest.mark.slow
def test_fault_soak(tmp_path):
    """Each cycle kills a rank (SIGKILL or SIGTERM) at a fault point or a random time and
    relaunches; the script checks the loss curve bitwise against an uninterrupted run, that no
    process, no .tmp folder and no extra step is left, and that the metrics join."""
    script = ROOT / "scripts" / "fault_soak.py"
    cmd = [sys.executable, str(script), f"--cycles={CYCLES}", "--seed=0", f"--folder={tmp_path}"]
    out = run_checked(cmd, timeout=300)
    assert "fault soak passed" in out, out[-3000:]
    assert out.count("\ncycle ") + out.startswith("cycle ") == CYCLES, out[-3000:]
