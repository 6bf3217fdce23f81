"""The tensorwise float8 matmul of a linear, with the weight-gradient's input cast our own.

``TensorwiseFloat8Matmul`` computes what torchao's ``matmul_with_hp_or_float8_args`` does for
the tensorwise recipe, with torchao's casts and float8 matmuls, bit for bit, and differs in the
backward's cast of the input for the weight-gradient matmul:

* it uses the scale the forward computed (the same tensor has the same amax, so the same scale)
  instead of a second amax pass over the input;
* with ``tiled=True`` it goes through ``float8_cast_transposed``, an operator inductor does not
  fuse, so the compiled backward does not write the column-major float8 input from inside a
  norm's backward reduction (docs/performance.md). For the linears a norm feeds;
  the others' inputs come out of pointwise kernels that inductor tiles well (``tiled=False``).

Everything else (rowwise recipes, inputs already in float8 from TP's float8 all-gather, DTensor
operands) runs torchao's function: ``float8_matmul`` picks.
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
    hp_tensor_and_scale_to_float8,
)

from torchtitan.float8.transposed_cast import float8_cast_transposed


def is_tensorwise(config: Float8LinearConfig) -> bool:
    """Dynamic tensorwise scaling for every operand, the same cast for both uses of each."""
    casts = (config.cast_config_input, config.cast_config_weight, config.cast_config_grad_output)
    same_for_grads = (
        config.cast_config_input_for_grad_weight == config.cast_config_input
        and config.cast_config_weight_for_grad_input == config.cast_config_weight
        and config.cast_config_grad_output_for_grad_weight == config.cast_config_grad_output
    )
    return same_for_grads and all(
        c.scaling_type is ScalingType.DYNAMIC
        and c.scaling_granularity is ScalingGranularity.TENSORWISE
        for c in casts
    )


def float8_matmul(input: torch.Tensor, weight_t: torch.Tensor, linear: Float8TensorwiseLinear):
    """``input @ weight_t`` in float8 as ``linear`` is configured: ours where it applies and
    the linear's ``own_backward`` asks for it, torchao's otherwise."""
    ours = (
        linear.own_backward
        and is_tensorwise(linear.config)
        and not isinstance(input, DTensor)
        and not isinstance(weight_t, DTensor)
        and not tensor_already_casted_to_fp8(input)
    )
    if not ours:
        return matmul_with_hp_or_float8_args.apply(
            input, weight_t, linear.linear_mm_config, linear.config
        )
    return TensorwiseFloat8Matmul.apply(
        input, weight_t, linear.linear_mm_config, linear.config, linear.tiled_input_cast
    )


def dynamic_cast(tensor, cast_config, mm_config: LinearMMConfig, role: GemmInputRole, config):
    """``tensor`` cast to float8 by its own amax, as torchao's linear casts an operand of
    ``role``."""
    return hp_tensor_to_float8_dynamic(
        tensor,
        cast_config.target_dtype,
        mm_config,
        gemm_input_role=role,
        round_scales_to_power_of_2=config.round_scales_to_power_of_2,
    )


def weight_in_float8(weight_t, mm_config: LinearMMConfig, config: Float8LinearConfig):
    """The weight as cast for the matmuls (FSDP's float8 all-gather may have cast it already)."""
    if tensor_already_casted_to_fp8(weight_t):
        return weight_t
    return dynamic_cast(
        weight_t, config.cast_config_weight, mm_config, GemmInputRole.WEIGHT, config
    )


@torch._dynamo.allow_in_graph
class TensorwiseFloat8Matmul(torch.autograd.Function):
    """``input @ weight_t`` with float8 operands and tensorwise scales (see the module doc)."""

    @staticmethod
    def forward(
        ctx, input_hp, weight_t, mm_config: LinearMMConfig, config: Float8LinearConfig, tiled: bool
    ):
        input_fp8 = dynamic_cast(
            input_hp, config.cast_config_input, mm_config, GemmInputRole.INPUT, config
        )
        ctx.save_for_backward(input_hp, weight_t, input_fp8._scale)
        ctx.mm_config, ctx.config, ctx.tiled = mm_config, config, tiled
        weight_fp8_t = weight_in_float8(weight_t, mm_config, config)
        out = torch.mm(input_fp8.reshape(-1, input_fp8.shape[-1]), weight_fp8_t)
        return out.reshape(*input_hp.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad_output):
        input_hp, weight_t, input_scale = ctx.saved_tensors
        mm_config, config = ctx.mm_config, ctx.config
        grad_2d = grad_output.reshape(-1, grad_output.shape[-1])
        grad_fp8 = dynamic_cast(
            grad_2d, config.cast_config_grad_output, mm_config, GemmInputRole.GRAD_OUTPUT, config
        )
        weight_fp8_t = weight_in_float8(weight_t, mm_config, config)
        grad_input = torch.mm(grad_fp8, weight_fp8_t.t())
        grad_input = grad_input.reshape(*grad_output.shape[:-1], grad_input.shape[-1])
        input_2d = input_hp.reshape(-1, input_hp.shape[-1])
        target = config.cast_config_input.target_dtype
        if ctx.tiled:
            bits = float8_cast_transposed(input_2d, input_scale, target)
            input_fp8 = Float8TrainingTensor(
                bits.t(), input_scale, input_hp.dtype, mm_config, GemmInputRole.INPUT
            )
        else:  # the matmul transposes it; inductor fuses that into the kernel computing input_2d
            input_fp8 = hp_tensor_and_scale_to_float8(
                input_2d, input_scale, target, mm_config, GemmInputRole.INPUT
            )
        grad_weight = torch.mm(grad_fp8.t(), input_fp8)
        return grad_input, grad_weight.t(), None, None, None


class Float8TensorwiseLinear(Float8Linear):
    """torchao's ``Float8Linear`` with its matmul picked by ``float8_matmul``: ours when
    ``own_backward``, its input cast tiled when ``tiled_input_cast`` (set per module by
    ``torchtitan.float8.convert.use_own_backward``)."""

    own_backward = True
    tiled_input_cast = False

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return float8_linear_forward(self, input, float8_matmul)


def float8_linear_forward(linear: Float8Linear, input: torch.Tensor, matmul) -> torch.Tensor:
    """``Float8Linear.forward`` with its matmul replaced by ``matmul(input, weight_t, linear)``."""
    if torch.is_autocast_enabled():  # as Float8Linear does: the output in autocast's dtype
        input = input.to(torch.get_autocast_gpu_dtype())
    output = matmul(input, linear.weight.t(), linear)
    if linear.bias is not None:
        output = output + linear.bias.to(output.dtype)
    return output
