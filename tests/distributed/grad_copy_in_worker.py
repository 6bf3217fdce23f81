"""FSDP2 with our gradient copy-in (torchtitan/experimental/grad_copy_in.py) on gloo ranks, the
kernel under Triton's CPU interpreter: two copies of a small model trained side by side, one
with FSDP's own copy-in and one with ours, on a 1-D mesh (FSDP) and a 2-D one (HSDP: 2 replicas
of 2 shards), must agree bit for bit; rank 0 prints ``COPY_IN_RESULT {json}`` with how many
gradients the kernel laid out."""

from __future__ import annotations

import copy
import json
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel's module is imported (on first use)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from torchtitan.experimental import grad_copy_in_kernel  # noqa: E402
from torchtitan.experimental.grad_copy_in import use_triton_grad_copy_in  # noqa: E402

DIM, HIDDEN = 12, 32  # dim 0 of every weight divides by 4 ranks: the kernel's path
KERNEL_CALLS = 0


def counted(copy_chunks):
    def wrapper(*args, **kwargs):
        global KERNEL_CALLS
        KERNEL_CALLS += 1
        return copy_chunks(*args, **kwargs)

    return wrapper


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def one_case(mesh_shape: tuple[int, ...]) -> dict:
    rank = dist.get_rank()
    torch.manual_seed(0)
    plain = nn.Sequential(Block(), Block(), Block())
    ours = copy.deepcopy(plain)
    names = ("shard",) if len(mesh_shape) == 1 else ("replicate", "shard")
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    for model in (plain, ours):
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, ours)]
    losses = {"fsdp": [], "ours": []}
    for step in range(3):
        x = torch.randn(4, DIM, generator=torch.Generator().manual_seed(10 * step + rank))
        for name, model, optimizer in zip(losses, (plain, ours), optimizers, strict=True):
            use_triton_grad_copy_in(name == "ours")
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[name].append(loss.item())
    use_triton_grad_copy_in(False)
    deviation = max(
        (a.full_tensor() - b.full_tensor()).abs().max().item()
        for a, b in zip(plain.parameters(), ours.parameters(), strict=True)
    )
    same = torch.tensor([float(losses["fsdp"] == losses["ours"] and deviation == 0.0)])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    return {"same": bool(same.item()), "losses": losses["ours"], "deviation": deviation}


def main() -> None:
    grad_copy_in_kernel.copy_chunks = counted(grad_copy_in_kernel.copy_chunks)
    dist.init_process_group("gloo")
    results = {"fsdp": one_case((dist.get_world_size(),)), "hsdp": one_case((2, 2))}
    results["kernel_calls"] = KERNEL_CALLS
    if dist.get_rank() == 0:
        print("COPY_IN_RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
