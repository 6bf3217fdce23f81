"""RowShardedEmbedding on 4 gloo ranks (run by ``run_ranks``): its lookup and gradient against a
plain embedding of the whole table.

Each rank looks up its own ids (every id of a vocabulary appears on some rank; with 3 rows over 4
ranks one shard is empty). Rank 0 prints ``SE_RESULT {json}``, per case: whether the outputs
equal the whole table's rows bit for bit, and the gradient's largest deviation from the average
over ranks of each rank's plain-embedding gradient (FSDP's averaging), relative to its largest
entry.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from torchtitan.experimental.sharded_embedding import RowShardedEmbedding

DIM = 8


def one_case(mesh_shape: tuple[int, ...], vocab: int, out_dtype: torch.dtype) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    table = torch.randn(vocab, DIM, generator=torch.Generator().manual_seed(vocab))
    ids = torch.randint(0, vocab, (2, 5), generator=torch.Generator().manual_seed(100 + rank))
    ids[0, 0] = rank % vocab  # every row is looked up by some rank
    grad_out = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(200 + rank))

    names = ("shard",) if len(mesh_shape) == 1 else ("replicate", "shard")
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    module = RowShardedEmbedding(
        nn.Embedding(vocab, DIM, _weight=table), mesh, out_dtype, torch.float32
    )
    out = module(ids)
    out.backward(grad_out.to(out_dtype))

    plain = nn.Embedding(vocab, DIM, _weight=table.to(out_dtype).float().clone())
    plain(ids).backward(grad_out.to(out_dtype).float())
    expected = plain.weight.grad.clone()
    dist.all_reduce(expected)
    expected /= world

    grad = module.weight.grad
    assert isinstance(grad, DTensor) and grad.placements == module.weight.placements
    deviation = (grad.full_tensor() - expected).abs().max() / expected.abs().max()
    exact = torch.equal(out, table.to(out_dtype)[ids]) and out.dtype == out_dtype
    flags = torch.tensor([float(exact), deviation.item()])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)  # every rank's output exact
    worst = torch.tensor([deviation.item()])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return {
        "exact": bool(flags[0]),
        "grad_rel": worst.item(),
        "local_rows": module.weight.to_local().shape[0],
    }


def main() -> None:
    dist.init_process_group("gloo")
    results = {}
    for mesh_shape in ((4,), (2, 2)):
        for vocab in (64, 7, 3):
            for dtype in (torch.float32, torch.bfloat16):
                key = (
                    f"{'x'.join(map(str, mesh_shape))}/{vocab}/{str(dtype).removeprefix('torch.')}"
                )
                results[key] = one_case(mesh_shape, vocab, dtype)
    if dist.get_rank() == 0:
        print("SE_RESULT " + json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
