"""Our gradient copy-in through FSDP2 on 4 gloo ranks (grad_copy_in_worker.py), FSDP and HSDP:
the same losses and weights, bit for bit, as FSDP's own copy-in, with the kernel (under Triton's
CPU interpreter) laying out every gradient of our copy."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import run_ranks

WORKER = Path(__file__).with_name("grad_copy_in_worker.py")


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
    reason="needs triton's CPU interpreter (on a GPU: tests/gpu/test_grad_copy_in_on_gpu.py)",
)
def test_fsdp_trains_the_same_with_our_copy_in():
    out = run_ranks(4, [str(WORKER)], timeout=300)
    (line,) = [x for x in out.splitlines() if x.startswith("COPY_IN_RESULT ")]
    result = json.loads(line.removeprefix("COPY_IN_RESULT "))
    for case in ("fsdp", "hsdp"):
        assert result[case]["same"], result
        assert result[case]["losses"][2] < result[case]["losses"][0], result  # it trained
    # 3 blocks x 4 parameters x 3 steps x 2 cases, through the kernel; none left to FSDP's
    assert result["kernel_calls"] == 72, result
