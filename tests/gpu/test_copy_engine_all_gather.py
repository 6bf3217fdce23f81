"""The copy-engine all-gather on GPUs (up to 4, NCCL, CUDA symmetric memory, bf16 mixed
precision, FSDP's own streams): the same losses and weights, bit for bit, as NCCL's all-gather
over three training steps of a 3-block model, FSDP and (on 4 GPUs) HSDP
(tests/distributed/copy_engine_worker.py). The FSDP case passed on 4x H200, before
the HSDP case was added."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import run_checked, torchrun_cmd

WORKER = Path(__file__).parents[1] / "distributed" / "copy_engine_worker.py"


def test_copy_engine_all_gather_matches_nccl_on_gpus():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    gpus = min(4, torch.cuda.device_count())
    out = run_checked([*torchrun_cmd(gpus), str(WORKER), "cuda"], timeout=300)
    (line,) = [x for x in out.splitlines() if x.startswith("CE_RESULT ")]
    result = json.loads(line.removeprefix("CE_RESULT "))
    print(result)
    for case in [c for c in ("fsdp", "hsdp") if c in result]:
        assert result[case]["same"], result
        assert list(result[case]["all_gathers"].values()) == [18], result  # 3 blocks x 2 x 3
