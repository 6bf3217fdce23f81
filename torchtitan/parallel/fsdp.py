"""FSDP2 (``fully_shard``) per transformer block and the root; HSDP and DDP on a 2-D mesh.

On a 1-D mesh this is FSDP. On a 2-D (replicate, shard) mesh FSDP2 shards within a replica group
and all-reduces across groups (HSDP); with a shard dimension of size 1 that is plain DDP, so one
code path serves all three.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from torchtitan.parallel.blocks import block_items


def _present(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    modules = []
    for name in names:
        try:
            modules.append(model.get_submodule(name))
        except AttributeError:  # absent, e.g. cut away (set to None) by a pipeline split
            pass
    return modules


def _shares_parameters(first: list[nn.Module], second: list[nn.Module]) -> bool:
    """Whether a parameter is in both module lists (tied input and output embeddings)."""
    ids = {id(p) for m in first for p in m.parameters()}
    return any(id(p) in ids for m in second for p in m.parameters())


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
    input_group: Sequence[str] = ("tok_embeddings",),
    output_group: Sequence[str] = ("norm", "output"),
    ignored_params: set[nn.Parameter] | None = None,
    after_blocks_sharded: Callable[[list[nn.Module], DeviceMesh], None] | None = None,
) -> None:
    """Shard ``model`` in place: the input modules (embeddings) as one group, each block, the
    output modules (final norm + head) as one group, then the root, which takes every parameter
    not in a group. Names in the groups that the model lacks (e.g. after a pipeline split) are
    skipped; a custom model names its own. When the input and output groups share a parameter
    (tied embeddings), both stay in the root: FSDP manages a parameter in one group only.

    Each group's parameters are all-gathered right before its forward and its gradients
    reduce-scattered right after its backward, which overlaps communication with compute.

    ``ignored_params``: parameters sharded by other means, which FSDP leaves alone (an input
    module holding only such parameters gets no group). ``after_blocks_sharded(blocks, mesh)``
    runs once the blocks are sharded (the experimental copy-engine all-gather hooks in there).
    """
    ignored = ignored_params or set()
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    # The blocks and the head get activations already in param_dtype (from the embeddings or the
    # block before; the root casts the model's own inputs). Casting their floating-point
    # arguments again would also round the float32 tables a block takes to param_dtype: Llama's
    # RoPE cache, a bf16 copy per block held for backward (64 MiB for 8B at seq 8192, more under
    # PP with microbatches in flight) and cos/sin rounded to bf16.
    inner = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=False
    )
    reshard = reshard_after_forward(reshard_policy, pipeline_parallel)
    inputs = [m for m in _present(model, input_group) if not set(m.parameters()) <= ignored]
    outputs = _present(model, output_group)
    if _shares_parameters(inputs, outputs):
        inputs, outputs = [], []
    if inputs:
        fully_shard(inputs, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    blocks = [block for _, block in block_items(model, blocks_attr)]
    # Every block reshards, the last one too: keeping it gathered for its backward saves one
    # all-gather per step but holds a whole block of bf16 weights at the memory peak (0.41 GiB
    # for Llama 3 8B, seen in a memory snapshot on 4x H200).
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=inner)
    if after_blocks_sharded is not None and blocks:
        after_blocks_sharded(blocks, mesh)
    # The head's backward comes right after its forward: keep it gathered.
    if outputs:
        fully_shard(outputs, mesh=mesh, reshard_after_forward=False, mp_policy=inner)
    fully_shard(
        model, mesh=mesh, reshard_after_forward=False, mp_policy=mp, ignored_params=ignored or None
    )
