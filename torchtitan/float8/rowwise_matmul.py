"""The rowwise float8 matmul of a linear, with the weight gradient's column-wise casts our own.

Rowwise float8 casts each matmul operand with one scale per row of the matmul's reduction: the
output gradient along its rows for the input-gradient matmul, and along its columns (one scale
per output feature, the amax over every token) for the weight-gradient matmul, which takes it
transposed. Compiled, inductor fuses that column-wise cast into the kernel that computes the
gradient, a reduction whose float8 stores land single bytes a whole row apart: for the SwiGLU's
w1 and w3 at 8B, 1.57 of a 20.8 ms block (docs/performance.md).

``RowwiseFloat8Matmul`` computes what torchao's ``matmul_with_hp_or_float8_args`` does for the
``rowwise`` recipe, with torchao's forward and casts, bit for bit, except that the weight-gradient
matmul's column-wise casts go through ``float8_cast_columnwise``, an operator inductor cannot
fuse: a one-read column amax and a tiled transposed cast that computes the scales from it
(``cast_kernel.py``), or torchao's own cast off CUDA.

Both operands take it: the output gradient, and the input unless ``columnwise_input_cast`` is
off (benchmarks compare with torchao's cast so). The input's cast runs in the backward under
activation checkpointing (the recompute) and without it (``recompute.py``'s pass), so the
forward keeps nothing more than for torchao's backward.

Other recipes, DTensor operands and inputs already in float8 run torchao's function:
``rowwise_float8_matmul`` picks.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torchao.float8.config import Float8LinearConfig, ScalingGranularity, ScalingType
from torchao.float8.distributed_utils import tensor_already_casted_to_fp8
from torchao.float8.float8_linear import Float8Linear, matmul_with_hp_or_float8_args
from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
from torchao.float8.float8_training_tensor import (
    Float8TrainingTensor,
    GemmInputRole,
    LinearMMConfig,
)
from torchao.float8.float8_utils import amax_to_scale, to_fp8_saturated

from torchtitan.float8.matmul import float8_linear_forward
from torchtitan.float8.transposed_cast import kernel_module


@torch.library.custom_op("torchtitan::float8_cast_columnwise", mutates_args=())
def float8_cast_columnwise(
    x: torch.Tensor, float8_dtype: torch.dtype, round_scales_to_power_of_2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (rows x cols) cast to ``float8_dtype`` with one scale per column, as torchao
    scales it (``amax_to_scale`` of the column's amax): returns the (cols x rows) row-major
    bits, whose ``.t()`` is the column-major operand, and the (1 x cols) float32 scales. On CUDA
    a NaN may leave its column's amax finite where torchao's is NaN (the column's other values
    then cast finite); the trainer skips steps with non-finite gradients anyway."""
    kernel = kernel_module(x)
    if kernel is not None:
        x = x if x.stride(1) == 1 else x.contiguous()
        amax = kernel.column_amax(x)
        return kernel.cast_columnwise_from_amax(x, amax, float8_dtype, round_scales_to_power_of_2)
    amax = torch.amax(torch.abs(x), dim=0, keepdim=True)
    scale = amax_to_scale(amax, float8_dtype, round_scales_to_power_of_2)
    bits = to_fp8_saturated(x.to(torch.float32) * scale, float8_dtype)
    return bits.t().contiguous(), scale


@float8_cast_columnwise.register_fake
def _(x: torch.Tensor, float8_dtype: torch.dtype, round_scales_to_power_of_2: bool):
    rows, cols = x.shape
    return (
        x.new_empty((cols, rows), dtype=float8_dtype),
        x.new_empty((1, cols), dtype=torch.float32),
    )


def is_rowwise(config: Float8LinearConfig) -> bool:
    """torchao's ``rowwise`` recipe: every operand of every matmul cast dynamically with one
    scale per row (of the matmul's reduction), in one float8 format."""
    casts = (
        config.cast_config_input,
        config.cast_config_weight,
        config.cast_config_grad_output,
        config.cast_config_input_for_grad_weight,
        config.cast_config_weight_for_grad_input,
        config.cast_config_grad_output_for_grad_weight,
    )
    return all(
        c.scaling_type is ScalingType.DYNAMIC
        and c.scaling_granularity is ScalingGranularity.AXISWISE
        and c.target_dtype == casts[0].target_dtype
        for c in casts
    )


def rowwise_float8_matmul(input: torch.Tensor, weight_t: torch.Tensor, linear: Float8Linear):
    """``input @ weight_t`` in rowwise float8: ours where it applies, torchao's otherwise."""
    ours = (
        is_rowwise(linear.config)
        and not isinstance(input, DTensor)
        and not isinstance(weight_t, DTensor)
        and not tensor_already_casted_to_fp8(input)
        and not tensor_already_casted_to_fp8(weight_t)
    )
    mm_config, config = linear.linear_mm_config, linear.config
    if not ours:
        return matmul_with_hp_or_float8_args.apply(input, weight_t, mm_config, config)
    return RowwiseFloat8Matmul.apply(
        input, weight_t, mm_config, config, linear.columnwise_input_cast
    )


def _cast_columnwise(x_2d: torch.Tensor, role: GemmInputRole, mm_config, config):
    """``x_2d`` cast with one scale per column through ``float8_cast_columnwise``, as the
    column-major operand of a weight-gradient matmul."""
    cast = (
        config.cast_config_grad_output_for_grad_weight
        if role is GemmInputRole.GRAD_OUTPUT
        else config.cast_config_input_for_grad_weight
    )
    bits_t, scale = float8_cast_columnwise(
        x_2d, cast.target_dtype, config.round_scales_to_power_of_2
    )
    return Float8TrainingTensor(bits_t.t(), scale, x_2d.dtype, mm_config, role, axiswise_dim=0)


def _cast_along(tensor, axis: int, role: GemmInputRole, mm_config, config):
    """torchao's dynamic cast with one scale per slice along ``axis`` (-1: per row)."""
    return hp_tensor_to_float8_dynamic(
        tensor,
        config.cast_config_input.target_dtype,
        mm_config,
        gemm_input_role=role,
        scaling_granularity=ScalingGranularity.AXISWISE,
        axiswise_dim=axis,
        round_scales_to_power_of_2=config.round_scales_to_power_of_2,
    )


@torch._dynamo.allow_in_graph
class RowwiseFloat8Matmul(torch.autograd.Function):
    """``input @ weight_t`` with rowwise float8 operands (see the module doc)."""

    @staticmethod
    def forward(
        ctx,
        input_hp,
        weight_t,
        mm_config: LinearMMConfig,
        config: Float8LinearConfig,
        columnwise_input_cast: bool,
    ):
        ctx.columnwise_input_cast = columnwise_input_cast
        # torchao's forward: it saves the high-precision operands and sets ctx's configs
        return matmul_with_hp_or_float8_args.forward(ctx, input_hp, weight_t, mm_config, config)

    @staticmethod
    def backward(ctx, grad_output):
        input_hp, weight_t = ctx.saved_tensors
        mm_config, config = ctx.linear_mm_config, ctx.config
        grad_2d = grad_output.reshape(-1, grad_output.shape[-1])
        grad_rows = _cast_along(grad_2d, -1, GemmInputRole.GRAD_OUTPUT, mm_config, config)
        weight_rows = _cast_along(weight_t, -1, GemmInputRole.WEIGHT, mm_config, config)
        grad_input = torch.mm(grad_rows, weight_rows.t())
        grad_input = grad_input.reshape(*grad_output.shape[:-1], grad_input.shape[-1])
        grad_columns = _cast_columnwise(grad_2d, GemmInputRole.GRAD_OUTPUT, mm_config, config)
        input_2d = input_hp.reshape(-1, input_hp.shape[-1])
        if ctx.columnwise_input_cast:
            input_columns = _cast_columnwise(input_2d, GemmInputRole.INPUT, mm_config, config)
        else:
            input_columns = _cast_along(input_2d, 0, GemmInputRole.INPUT, mm_config, config)
        grad_weight = torch.mm(grad_columns.t(), input_columns)
        return grad_input, grad_weight.t(), None, None, None


class Float8RowwiseLinear(Float8Linear):
    """torchao's ``Float8Linear`` whose matmul is ``rowwise_float8_matmul`` (set per module by
    ``torchtitan.float8.convert.use_rowwise_backward``); ``columnwise_input_cast`` False: the
    input's column-wise cast torchao's."""

    columnwise_input_cast = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return float8_linear_forward(self, input, rowwise_float8_matmul)
