"""Float8 linears under tensor parallelism that scale each rank's shard on its own.

A tensorwise scale is the amax of the whole tensor. When torchao casts a tensor that TP shards
(a row-parallel linear's input, every column-parallel linear's output gradient, a weight shard),
the amax is a DTensor reduction: a scalar all-reduce over the TP group that the cast, and then
the matmul, wait for. About 11 per block and step (docs/performance.md, finding 14).

The matmuls of a TP linear need no common scale: each rank multiplies its own shards, and the
scaled matmul returns high-precision partial results that TP then gathers or reduces as it does
in bf16. ``ShardScaledFloat8Linear`` therefore runs torchao's float8 matmul on the local shards
and wraps the result back into the DTensor layout the plain TP styles expect, so every scale is
its shard's own and no amax is reduced. The numerics differ from one device the way context
parallelism's do: each shard is scaled with the scale that fits it best, not the whole tensor's.
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from torchtitan.parallel.blocks import block_items
from torchtitan.parallel.float8 import import_torchao_float8, is_float8_linear

logger = logging.getLogger("torchtitan")


def _local_layout(input: DTensor, weight: DTensor):
    """``(input's placement for the local gradient, output placement)`` of a column- or
    row-parallel linear on a 1-D TP mesh, or None for any other layout."""
    if weight.device_mesh.ndim != 1 or input.device_mesh != weight.device_mesh:
        return None
    (w,), (x,) = weight.placements, input.placements
    last = Shard(input.ndim - 1)
    if w == Shard(0) and x == Replicate():  # column-parallel: each rank has some output features
        return Partial(), last  # x's gradient from this rank's features is a partial sum
    if w == Shard(1) and x == last:  # row-parallel: each rank has some input features
        return last, Partial()
    return None


def shard_scaled_float8_linear_class() -> type[nn.Linear]:
    """The ``Float8Linear`` subclass (built on first use: torchao is an optional extra)."""
    global _CLASS
    if _CLASS is None:
        import_torchao_float8()
        from torchao.float8.float8_linear import Float8Linear, matmul_with_hp_or_float8_args

        class ShardScaledFloat8Linear(Float8Linear):
            def forward(self, input: torch.Tensor) -> torch.Tensor:
                weight = self.weight
                layout = None
                if isinstance(input, DTensor) and isinstance(weight, DTensor):
                    layout = _local_layout(input, weight)
                if layout is None or self.bias is not None or torch.is_autocast_enabled():
                    return super().forward(input)
                input_grad_placement, output_placement = layout
                local_out = matmul_with_hp_or_float8_args.apply(
                    input.to_local(grad_placements=[input_grad_placement]),
                    weight.to_local().t(),
                    self.linear_mm_config,
                    self.config,
                )
                return DTensor.from_local(
                    local_out, weight.device_mesh, [output_placement], run_check=False
                )

        _CLASS = ShardScaledFloat8Linear
    return _CLASS


_CLASS: type[nn.Linear] | None = None


def scale_float8_by_shard(model: nn.Module, blocks_attr: str = "layers") -> int:
    """Make the float8 linears of ``model``'s blocks scale their TP shards on their own (after
    TP, before compile and FSDP); returns how many were changed."""
    cls = shard_scaled_float8_linear_class()
    changed = 0
    for _, block in block_items(model, blocks_attr):
        for module in block.modules():
            if is_float8_linear(module) and isinstance(module.weight, DTensor):
                module.__class__ = cls
                changed += 1
    logger.info("float8 + TP: %d linears scale their TP shards on their own", changed)
    return changed
