"""GPU time of FSDP2's reduce-scatter copy-in for one Llama 3 block: the bf16 gradients cast to
float32 and laid out rank by rank in the reduce-scatter buffer (``torch.ops.fsdp.chunk_cat``,
what ``foreach_reduce_scatter_copy_in`` runs on the compute stream), against one strided
copy per gradient into the same buffer and our Triton kernel per gradient
(torchtitan/experimental/grad_copy_in_kernel.py) at three block sizes (the same bytes; the buffers
are compared).

    python benchmarks/tools/reduce_scatter_copy_in.py --flavor 8B --world 4

In an 8B FSDP4 trace the copy-in takes about 0.74 ms per block (1.3 GB at about 1.8 TB/s, beside
the collectives); this measures it alone, queued behind a GPU sleep so only the kernels count
(cuda_timing.median_ms).
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  (torch.ops.fsdp.chunk_cat)
from cuda_timing import print_bandwidths

from torchtitan.experimental.grad_copy_in import lay_out
from torchtitan.models.llama3 import get_model_args


def block_grads(flavor: str, dtype: torch.dtype) -> list[torch.Tensor]:
    a = get_model_args(flavor)
    dim, kv, hidden = a.dim, a.kv_heads * a.head_dim, a.ffn_hidden_dim
    shapes = [(dim, dim), (kv, dim), (kv, dim), (dim, dim), (hidden, dim), (dim, hidden)]
    shapes += [(hidden, dim), (dim,), (dim,)]
    return [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]


def padded_rows(grad: torch.Tensor, world: int) -> int:
    return -(-grad.shape[0] // world) * world


def chunk_cat(grads: list[torch.Tensor], out: torch.Tensor, world: int) -> None:
    torch.ops.fsdp.chunk_cat(grads, dim=0, num_chunks=world, out=out.view(world, -1))


def strided_copies(grads: list[torch.Tensor], out: torch.Tensor, world: int) -> None:
    """Rank r's part of the buffer holds rows r/world of every gradient, one after the other."""
    rows_out = out.view(world, -1)
    offset = 0
    for g in grads:
        rows = padded_rows(g, world)
        per_rank = rows // world * (g.numel() // g.shape[0])
        target = rows_out[:, offset : offset + per_rank]
        if rows == g.shape[0]:
            target.copy_(g.view(world, per_rank))
        else:  # rows not divisible by world: chunk_cat pads each chunk; not in these shapes
            raise ValueError(f"{tuple(g.shape)} does not split into {world} equal chunks")
        offset += per_rank


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="8B")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--iters", type=int, default=50)
    a = p.parse_args()
    grads = block_grads(a.flavor, torch.bfloat16)
    numel = sum(padded_rows(g, a.world) * (g.numel() // g.shape[0]) for g in grads)
    out = torch.empty(numel, device="cuda", dtype=torch.float32)
    check = torch.empty_like(out)
    chunk_cat(grads, out, a.world)
    strided_copies(grads, check, a.world)
    same = torch.equal(out, check)
    check.zero_()
    lay_out(grads, check, a.world)
    print(
        f"{torch.cuda.get_device_name()}; {a.flavor} block, world {a.world}: {numel / 1e6:.1f} M "
        f"gradients; the same buffer all three ways: {same and torch.equal(out, check)}"
    )
    moved = numel * (2 + 4)  # bf16 read, float32 written
    variants = [("chunk_cat", chunk_cat), ("strided copies", strided_copies)]
    variants.append(("contiguous cast", lambda g, o, w: torch.cat([x.flatten() for x in g], out=o)))
    variants += [(f"triton {b}", functools.partial(lay_out, block=b)) for b in (1024, 4096, 16384)]
    print_bandwidths(variants, (grads, out, a.world), moved, a.iters)


if __name__ == "__main__":
    main()
