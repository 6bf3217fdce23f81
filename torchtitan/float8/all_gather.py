"""FSDP's float8 all-gather with each weight shard's cast in one kernel of our own.

With ``--float8.fsdp_float8_all_gather`` torchao wraps each float8 linear's weight in
``WeightWithDynamicFloat8CastTensor``, whose ``fsdp_pre_all_gather`` casts the local shard to
float8 before FSDP gathers it. With precomputed scales that cast is three eager kernels per
weight (scale, saturate, convert: 17 bytes moved per float32 element), run twice a step under
resharding (the forward's gather and the backward's). FSDP runs them on its copy-in stream, beside
the blocks' matmuls (8B FSDP4 Float8 on H200: about 55 ms of kernels a step, docs/performance.md).
``Float8AllGatherWeight`` is that wrapper with the cast in one pass
(``cast_kernel.cast`` on CUDA: 5 bytes per element), the same bits. Without precomputed
scales (an amax all-reduce per weight) it is torchao's cast.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torchao.float8.float8_utils import to_fp8_saturated
from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

from torchtitan.float8.transposed_cast import kernel_module


def cast_to_float8(x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype) -> torch.Tensor:
    """torchao's tensorwise cast (``x.float() * scale``, saturated, rounded to nearest), in one
    Triton kernel for contiguous CUDA tensors."""
    kernel = kernel_module(x)
    if kernel is not None and x.is_contiguous():
        return kernel.cast(x, scale, float8_dtype)
    return to_fp8_saturated(x.to(torch.float32) * scale, float8_dtype)


class Float8AllGatherWeight(WeightWithDynamicFloat8CastTensor):
    """torchao's weight wrapper for float8 all-gather, casting with ``cast_to_float8``."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        # torchao's wraps what it keeps wrapped (FSDP's sharding views and copies) in its own
        # class; keep ours so the shards FSDP gathers still cast with our kernel.
        out = super().__torch_dispatch__(func, types, args, kwargs)
        return pytree.tree_map_only(WeightWithDynamicFloat8CastTensor, cls._from_torchao, out)

    @classmethod
    def _from_torchao(cls, t: WeightWithDynamicFloat8CastTensor) -> Float8AllGatherWeight:
        if type(t) is cls:
            return t
        return cls(t._tensor, t._linear_mm_config, t._dtype, t._precomputed_scale)

    @staticmethod
    def __tensor_unflatten__(inner_tensors, flatten_spec, outer_size, outer_stride):
        return Float8AllGatherWeight(
            inner_tensors["_tensor"],
            flatten_spec["mm_config"],
            flatten_spec["dtype"],
            inner_tensors.get("_precomputed_scale"),
        )

    def fsdp_pre_all_gather(self, mesh):
        scale = self._precomputed_scale
        if scale is None:
            return super().fsdp_pre_all_gather(mesh)
        return (cast_to_float8(self._tensor, scale, self._dtype),), (scale,)


torch.serialization.add_safe_globals([Float8AllGatherWeight])


def use_fused_all_gather_cast(model: nn.Module) -> int:
    """Rewrap each float8 all-gather weight of ``model`` in ``Float8AllGatherWeight``, after
    float8 conversion and before TP and FSDP; returns how many."""
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if type(weight) is not WeightWithDynamicFloat8CastTensor:  # torchao's, as a Parameter
            continue
        ours = Float8AllGatherWeight._from_torchao(weight)
        module.weight = nn.Parameter(ours, requires_grad=weight.requires_grad)
        count += 1
    return count
