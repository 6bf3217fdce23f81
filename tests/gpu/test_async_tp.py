"""Async TP: inductor's micro-pipeline pass replaces TP's all-gather + matmul and matmul +
reduce-scatter with fused symmetric-memory ops on these machines (NVLink multicast off)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.distributed.launch import run_checked, torchrun_cmd

WORKER = Path(__file__).with_name("async_tp_worker.py")


def test_async_tp_fuses_the_tp_collectives():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    out = run_checked([*torchrun_cmd(2), str(WORKER), "8192"], timeout=300)
    lines = {m[0]: m[1] for m in re.findall(r"ASYNC_TP_RESULT (\w+): (.*)", out)}
    print("\n".join(f"{k}: {v}" for k, v in lines.items()))
    assert "fused_all_gather_matmul': 0" in lines["sync"]
    assert "fused_all_gather_matmul': 0" not in lines["async"], lines["async"]
    assert "fused_matmul_reduce_scatter': 0" not in lines["async"], lines["async"]
