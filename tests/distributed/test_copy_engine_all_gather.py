"""The copy-engine all-gather (torchtitan/experimental/copy_engine_all_gather.py) through FSDP2 on 4
gloo ranks, FSDP and HSDP (2 replicas of 2 shards), with files standing in for CUDA symmetric
memory (copy_engine_worker.py): the same losses and weights, bit for bit, as FSDP's own
all-gather, one buffer pair per output size, and the pairs counted as memory outside the caching
allocator."""

from __future__ import annotations

import json
from pathlib import Path

from tests.distributed.launch import run_ranks

WORKER = Path(__file__).with_name("copy_engine_worker.py")


def test_fsdp_trains_the_same_with_the_copy_engine_all_gather(tmp_path):
    out = run_ranks(4, [str(WORKER), str(tmp_path)], timeout=120)
    (line,) = [x for x in out.splitlines() if x.startswith("CE_RESULT ")]
    result = json.loads(line.removeprefix("CE_RESULT "))
    for case in ("fsdp", "hsdp"):
        assert result[case]["same"], result
        assert result[case]["losses"][2] < result[case]["losses"][0], result  # it trained
    # Each block's up (30 -> 32 rows x 12, + 32) and down (12 x 30, + 12) in float32, padded per
    # parameter to a multiple of the shard count (4 for FSDP; HSDP's 2 pads nothing).
    fsdp_bytes = 4 * (32 * 12 + 32 + 12 * 30 + 12)
    hsdp_bytes = 4 * (30 * 12 + 30 + 12 * 30 + 12)
    # 3 blocks x (forward + backward's re-gather) x 3 steps
    assert result["fsdp"]["all_gathers"] == {str(fsdp_bytes): 18}, result
    assert result["hsdp"]["all_gathers"] == {str(hsdp_bytes): 18}, result
    assert result["symmetric_bytes"] == 2 * (fsdp_bytes + hsdp_bytes), result
