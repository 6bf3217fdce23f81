"""Float8 linears under tensor parallelism that scale each rank's shard on its own.

A tensorwise scale is the amax of the whole tensor. When torchao casts a tensor that TP shards
(a row-parallel linear's input, every column-parallel linear's output gradient, a weight shard),
the amax is a DTensor reduction: a scalar all-reduce over the TP group that the cast, and then
the matmul, wait for. About 11 per block and step (docs/performance.md).

The matmuls of a TP linear need no common scale: each rank multiplies its own shards, and the
scaled matmul returns high-precision partial results that TP then gathers or reduces as it does
in bf16. ``ShardScaledFloat8Linear`` therefore runs torchao's float8 matmul on the local shards
and wraps the result back into the DTensor layout the plain TP styles expect, so every scale is
its shard's own and no amax is reduced. The numerics differ from one device the way context
parallelism's do: each shard is scaled with the scale that fits it best, not the whole tensor's.
Tensorwise recipe only. The class itself lives in ``shard_scaled.py`` (it imports torchao).
"""

from __future__ import annotations

import logging

import torch.nn as nn
from torch.distributed.tensor import DTensor

from torchtitan.config import Float8
from torchtitan.float8.convert import import_torchao_float8, is_float8_linear
from torchtitan.parallel.blocks import block_items

logger = logging.getLogger("torchtitan")


def scales_tp_shards(cfg: Float8) -> bool:
    """Whether the float8 linears scale their TP shards on their own: tensorwise only (rowwise
    under TP with shard rows is not tested across ranks)."""
    return cfg.enable and cfg.recipe == "tensorwise"


def scale_float8_by_shard(model: nn.Module, blocks_attr: str = "layers") -> int:
    """Make the float8 linears of ``model``'s blocks scale their TP shards on their own (after
    TP, before compile and FSDP); returns how many were changed."""
    import_torchao_float8()
    from torchtitan.float8.matmul import Float8TensorwiseLinear
    from torchtitan.float8.shard_scaled import ShardScaledFloat8Linear

    changed = 0
    for _, block in block_items(model, blocks_attr):
        for module in block.modules():
            if is_float8_linear(module) and isinstance(module.weight, DTensor):
                if not isinstance(module, Float8TensorwiseLinear):  # keep torchao's backward
                    module.own_backward = False
                module.__class__ = ShardScaledFloat8Linear
                changed += 1
    logger.info("float8 + TP: %d linears scale their TP shards on their own", changed)
    return changed
