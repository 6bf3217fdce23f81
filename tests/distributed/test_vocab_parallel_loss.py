"""The in-place loss on vocabulary-sharded logits (TP's loss parallel) equals the plain loss of
the whole logits, in value and gradient (vocab_parallel_worker.py; fp32, so to fp32 rounding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.launch import run_ranks

WORKER = Path(__file__).with_name("vocab_parallel_worker.py")


@pytest.mark.parametrize("tp", [2, 3])
def test_in_place_loss_on_vocab_sharded_logits_matches_the_whole_logits(tp):
    out = run_ranks(tp, [str(WORKER)], timeout=120)
    (line,) = [x for x in out.splitlines() if x.startswith("VP_RESULT ")]
    result = json.loads(line.removeprefix("VP_RESULT "))
    assert result["tp"] == tp
    print(f"tp={tp}: {result}")
    assert result["loss_rel"] < 1e-6 and result["loss_only_rel"] < 1e-6
    assert result["grad_rel"] < 1e-6
