"""Context parallelism on CPU/gloo: the debug Llama's loss and grads under ``cp_context`` equal the
full-sequence run, for both rotate methods and with/without load balancing (cp_worker.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.launch import ROOT, run_ranks
from torchtitan.parallel.context_parallel import check_cp

WORKER = Path(__file__).with_name("cp_worker.py")


@pytest.fixture(autouse=True)
def this_checkout(monkeypatch):
    """The worker runs as a script: make it import this checkout's torchtitan, not whichever one
    is installed."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def run_worker(nproc: int, timeout: int = 120) -> dict:
    out = run_ranks(nproc, [str(WORKER)], timeout)
    lines = [line for line in out.splitlines() if line.startswith("CP_RESULT ")]
    assert len(lines) == 1, out[-3000:]
    return json.loads(lines[0].removeprefix("CP_RESULT "))


@pytest.mark.parametrize("cp", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_cp_matches_full_sequence(cp):
    result = run_worker(cp)
    assert result["cp"] == cp
    for variant in ("allgather", "alltoall", "allgather_nolb"):
        dev = result[variant]
        print(f"cp={cp} {variant}: loss rel {dev['loss_rel']:.1e}, grad abs {dev['grad_abs']:.1e}")
        assert dev["loss_rel"] < 1e-5
        assert dev["grad_abs"] < 1e-6


def test_check_cp():
    assert check_cp(64, 1) is None
    assert check_cp(64, 4) is None
    assert check_cp(63, 1) is None
    assert "divisible by 2 * context_parallel_degree = 8" in check_cp(68, 4)
    assert ">= 1" in check_cp(64, 0)


DOCUMENT_WORKER = Path(__file__).with_name("cp_document_worker.py")


@pytest.mark.parametrize("args", [[], ["--reset-positions"]], ids=["document", "reset_positions"])
def test_document_masked_cp_matches_full_sequence(args):
    """CP2 with the 128-token snake split: keys and values gathered in attention, the queries'
    rows of the document mask (cp_document_worker.py)."""
    out = run_ranks(2, [str(DOCUMENT_WORKER), *args], 120)
    lines = [line for line in out.splitlines() if line.startswith("CP_DOC_RESULT ")]
    assert len(lines) == 1, out[-3000:]
    result = json.loads(lines[0].removeprefix("CP_DOC_RESULT "))
    assert result["loss_rel"] < 1e-6
    assert result["grad_rel"] < 1e-5
