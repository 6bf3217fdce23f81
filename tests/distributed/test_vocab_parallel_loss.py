"""The fused chunked loss under tensor parallelism equals the plain loss of the whole logits, in
value and gradients (vocab_parallel_worker.py; fp32, so to fp32 rounding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.launch import run_ranks

WORKER = Path(__file__).with_name("vocab_parallel_worker.py")


@pytest.mark.parametrize("tp", [2, 3])
def test_vocab_parallel_fused_loss_matches_the_whole_logits(tp):
    out = run_ranks(tp, [str(WORKER)], timeout=120)
    (line,) = [x for x in out.splitlines() if x.startswith("VP_RESULT ")]
    result = json.loads(line.removeprefix("VP_RESULT "))
    assert result["tp"] == tp
    for chunk in ("7", "1000"):
        dev = result[chunk]
        print(f"tp={tp} chunk={chunk}: {dev}")
        assert dev["loss_rel"] < 1e-6 and dev["loss_only_rel"] < 1e-6
        assert dev["h_grad_rel"] < 1e-6 and dev["w_grad_rel"] < 1e-6
