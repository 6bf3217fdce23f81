"""``ShardScaledFloat8Linear``: torchao's ``Float8Linear`` run on the local TP shards.

Imported only when float8 runs under TP (it imports torchao, an optional extra); the why is in
``tp.py``.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from torchtitan.float8.matmul import Float8TensorwiseLinear, float8_matmul


def local_layout(input: DTensor, weight: DTensor):
    """``(input's placement for the local gradient, output placement)`` of a column- or
    row-parallel linear on a 1-D TP mesh with evenly split shards, or None for any other
    layout."""
    mesh = weight.device_mesh
    if mesh.ndim != 1 or input.device_mesh != mesh:
        return None
    (w,), (x,) = weight.placements, input.placements
    last = Shard(input.ndim - 1)
    if w == Shard(0) and x == Replicate() and weight.shape[0] % mesh.size() == 0:
        return Partial(), last  # column-parallel: x's gradient from this rank's features is partial
    if w == Shard(1) and x == last and weight.shape[1] % mesh.size() == 0:
        return last, Partial()  # row-parallel: a partial sum over this rank's input features
    return None


class ShardScaledFloat8Linear(Float8TensorwiseLinear):
    """Scales each local shard by its own amax; any other layout runs the parent's forward.
    ``own_backward`` is set per module by ``scale_float8_by_shard``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        layout = None
        if isinstance(input, DTensor) and isinstance(weight, DTensor) and self.bias is None:
            layout = local_layout(input, weight)
        if layout is None:
            return super().forward(input)
        if torch.is_autocast_enabled():  # as Float8Linear does: the output in autocast's dtype
            input = input.to(torch.get_autocast_gpu_dtype())
        input_grad_placement, output_placement = layout
        local_out = float8_matmul(
            input.to_local(grad_placements=[input_grad_placement]),
            weight.to_local().t(),
            self,
        )
        return DTensor.from_local(
            local_out, weight.device_mesh, [output_placement], run_check=False
        )
