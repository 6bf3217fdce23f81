"""The copy-engine all-gather through FSDP2: two copies of a small model trained side by side,
one with FSDP's own all-gather and one with ``CopyEngineAllGather``, must agree bit for bit.

``copy_engine_worker.py FOLDER`` runs on gloo ranks (``run_ranks``), with the symmetric memory
emulated by files every rank maps (``torch.from_file``, shared): each rank's buffer is its own
file, a peer's view maps the peer's file, and the barrier is the group's. That is the contract
``SymmetricBufferPair`` gives on CUDA. ``copy_engine_worker.py cuda`` runs under torchrun on GPUs
with the real thing, bf16 mixed precision and CUDA streams (tests/gpu/). Rank 0 prints
``CE_RESULT {json}``.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from torchtitan.experimental.copy_engine_all_gather import (
    SymmetricBufferPair,
    use_copy_engine_all_gather,
)

CUDA = sys.argv[1] == "cuda"
FOLDER = Path(sys.argv[1])
DIM, HIDDEN = (1024, 3584) if CUDA else (12, 30)  # on 4 ranks FSDP pads 30 rows to 32


class GroupBarrier:
    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    def barrier(self, channel: int = 0) -> None:
        dist.barrier(group=self.group)


class FileBufferPair:
    """Two buffers per rank, each a file that every rank of the group maps."""

    def __init__(self, nbytes: int, group: dist.ProcessGroup, device: torch.device):
        rank, world = group.rank(), group.size()
        self.buffers, self.handles, self.peer_views = [], [], []
        for index in range(2):
            name = f"{group.group_name}-{nbytes}-{index}"
            paths = [FOLDER / f"{name}-{peer}" for peer in range(world)]
            self.buffers.append(torch.from_file(str(paths[rank]), True, nbytes, dtype=torch.uint8))
            dist.barrier(group=group)  # every rank's file exists
            self.peer_views.append(
                [torch.from_file(str(p), True, nbytes, dtype=torch.uint8) for p in paths]
            )
            self.handles.append(GroupBarrier(group))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def one_case(mesh_shape: tuple[int, ...], device: torch.device) -> dict:
    """Train a model twice from one init, FSDP's all-gather against the copy engines', on a 1-D
    (FSDP) or 2-D (HSDP: replicate, shard) mesh; the blocks gather over the shard group."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    plain = nn.Sequential(Block(), Block(), Block()).to(device)
    gathered = copy.deepcopy(plain)
    names = ("shard",) if len(mesh_shape) == 1 else ("replicate", "shard")
    mesh = init_device_mesh(device.type, mesh_shape, mesh_dim_names=names)
    mp = MixedPrecisionPolicy(torch.bfloat16, torch.float32) if CUDA else MixedPrecisionPolicy()
    for model in (plain, gathered):
        for block in model:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
    make_pair = SymmetricBufferPair if CUDA else FileBufferPair
    comm = use_copy_engine_all_gather(list(gathered), mesh.get_group("shard"), make_pair)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, gathered)]
    losses = {0: [], 1: []}
    for step in range(3):
        x = torch.randn(4, DIM, generator=torch.Generator().manual_seed(10 * step + rank))
        x = x.to(device)
        for i, (model, optimizer) in enumerate(zip((plain, gathered), optimizers, strict=True)):
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[i].append(loss.item())
    deviation = max(
        (a.full_tensor() - b.full_tensor()).abs().max().item()
        for a, b in zip(plain.parameters(), gathered.parameters(), strict=True)
    )
    same = torch.tensor([float(losses[0] == losses[1] and deviation == 0.0)], device=device)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)  # on every rank
    return {
        "same": bool(same.item()),
        "weight_deviation": deviation,
        "losses": losses[1],
        "all_gathers": dict(comm.taken),
        "symmetric_bytes": comm.symmetric_bytes,
    }


def main() -> None:
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if CUDA else torch.device("cpu")
    if CUDA:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if CUDA else "gloo")
    world = dist.get_world_size()
    results = {"fsdp": one_case((world,), device)}
    if world % 2 == 0 and world > 2:
        results["hsdp"] = one_case((2, world // 2), device)
    results["symmetric_bytes"] = sum(case["symmetric_bytes"] for case in results.values())
    if dist.get_rank() == 0:
        print("CE_RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
