"""Test-only record of each rank's weights, inert unless ``TORCHTITAN_FT_PROBE`` names a folder.

The fault-tolerance tests compare replica groups through it: after each step (``step``), and in
semi-synchronous training also right after the local optimizer step, before a synchronization
(``inner``), every rank writes ``<folder>/replica_<id>/rank_<r>/<step>_<point>.pt`` holding a
SHA-256 digest of all its local parameter shards and buffers (bitwise equality; buffers such as
MoE selection biases are state the groups must agree on too) and its shard of one parameter (the
first of block 0, for the arithmetic of an outer step).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
import torch.nn as nn

from torchtitan.fault_tolerance.gradients import local

ENV = "TORCHTITAN_FT_PROBE"


class WeightsProbe:
    def __init__(self, folder: Path, model_parts: list[nn.Module]):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.params = [(n, p) for part in model_parts for n, p in part.named_parameters()]
        self.buffers = [b for part in model_parts for b in part.buffers()]
        self.sample = next((n, p) for n, p in self.params if "layers.0." in n)

    @classmethod
    def from_env(cls, replica_id: int, rank: int, model_parts) -> WeightsProbe | None:
        base = os.environ.get(ENV)
        if not base:
            return None
        return cls(Path(base) / f"replica_{replica_id}" / f"rank_{rank}", model_parts)

    def record(self, step: int, point: str) -> None:
        digest = hashlib.sha256()
        for tensor in [p for _, p in self.params] + self.buffers:
            digest.update(local(tensor).detach().cpu().reshape(-1).view(torch.uint8).numpy())
        name, param = self.sample
        torch.save(
            {
                "digest": digest.hexdigest(),
                "name": name,
                "tensor": local(param).detach().cpu().clone(),
            },
            self.folder / f"{step:05d}_{point}.pt",
        )
