"""FSDP2 (``fully_shard``) per transformer block and the root; HSDP and DDP on a 2-D mesh.

On a 1-D mesh this is FSDP. On a 2-D (replicate, shard) mesh FSDP2 shards within a replica group
and all-reduces across groups (HSDP); with a shard dimension of size 1 that is plain DDP, so one
code path serves all three.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from torchtitan.parallel.blocks import block_items

RESHARD_POLICIES = ("default", "always", "never")


def reshard_after_forward(policy: str, pipeline_parallel: bool) -> bool:
    """'default' frees gathered weights after forward, except under PP, where every microbatch's
    backward would gather them again."""
    if policy == "default":
        return not pipeline_parallel
    return policy == "always"


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype = torch.bfloat16,
    reduce_dtype: torch.dtype = torch.float32,
    reshard_policy: str = "default",
    pipeline_parallel: bool = False,
    blocks_attr: str = "layers",
) -> None:
    """Shard ``model`` in place: each block, Llama's ``tok_embeddings`` and ``norm`` + ``output``
    where present, then the root (which takes every parameter not in a group above).

    Each group's parameters are all-gathered right before its forward and its gradients
    reduce-scattered right after its backward, which overlaps communication with compute.
    """
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    reshard = reshard_after_forward(reshard_policy, pipeline_parallel)
    kwargs = dict(mesh=mesh, mp_policy=mp)
    if getattr(model, "tok_embeddings", None) is not None:
        fully_shard(model.tok_embeddings, reshard_after_forward=reshard, **kwargs)
    blocks = [block for _, block in block_items(model, blocks_attr)]
    for i, block in enumerate(blocks):
        # The last block's backward starts right after forward: keep its weights gathered.
        last = i == len(blocks) - 1
        fully_shard(block, reshard_after_forward=reshard and not last, **kwargs)
    head = [
        m for m in (getattr(model, "norm", None), getattr(model, "output", None)) if m is not None
    ]
    if head:
        fully_shard(head, reshard_after_forward=False, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)
