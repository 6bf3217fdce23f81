"""The row-sharded embedding (torchtitan/experimental/sharded_embedding.py) equals a lookup in the
whole table, in value and in FSDP-averaged gradient, on 1-D and HSDP meshes, with uneven and
empty shards (sharded_embedding_worker.py; fp32 gradients, so to fp32 rounding)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.distributed.launch import run_ranks

WORKER = Path(__file__).with_name("sharded_embedding_worker.py")


def test_row_sharded_lookup_and_gradient_match_the_whole_table():
    out = run_ranks(4, [str(WORKER)], timeout=120)
    (line,) = [x for x in out.splitlines() if x.startswith("SE_RESULT ")]
    results = json.loads(line.removeprefix("SE_RESULT "))
    assert len(results) == 12, results
    for case, result in results.items():
        assert result["exact"], case
        assert result["grad_rel"] < 1e-6, (case, result)
    # Rank 0's slice: torch.chunk's split, as FSDP would shard the table.
    assert results["4/64/float32"]["local_rows"] == 16
    assert results["4/7/float32"]["local_rows"] == 2
    assert results["2x2/3/float32"]["local_rows"] == 2
