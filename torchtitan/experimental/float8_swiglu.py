"""The float8 SwiGLU feed-forward ``w2(silu(w1(x)) * w3(x))`` as one autograd function, so its
backward casts the SiLU-and-product gradients in kernels of our own.

Unfused, each of the three float8 linears runs our tensorwise backward (float8/matmul.py) and
autograd computes the SwiGLU's gradients between them; compiled, inductor fuses those gradients
into their linears' float8 casts: one reduction kernel for their amaxes, then one pointwise
kernel writing the two gradients in float8 row-major and transposed and the recomputed product
transposed for w2's weight gradient, at 3.1 and 2.5 TB/s on an H200 (1.7 ms of a 25 ms 1B
block; docs/performance.md).
``Float8SwiGLU`` computes the same matmuls with the same casts, but its backward gets the
gradients' amaxes and all five float8 operands from two operators of ours
(``torchtitan::swiglu_float8_grad_amax`` and ``torchtitan::swiglu_float8_grad_cast``): Triton
kernels on CUDA (float8_swiglu_kernel.py), the same arithmetic in torch ops elsewhere. Both
round to bf16 where eager's ops do, so on CPU the fused feed-forward trains bit for bit like
the unfused one (compiled: when inductor rounds like eager too, ``emulate_precision_casts``;
by default it skips those roundings inside its fused kernels, so the two differ by a float8
rounding here and there). The block input's transposed cast for w1's and w3's weight gradients
is the tiled one (``float8_cast_transposed``) when the model family tiles w1's cast, as unfused.

``use_fused_swiglu`` swaps a block's feed-forward to it when its three linears are float8 with
our tensorwise backward and no bias; under TP (whose styles hook the linears themselves) it is
not used. A call whose inputs are DTensors or already float8 runs the unfused forward.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torchao.float8.distributed_utils import tensor_already_casted_to_fp8
from torchao.float8.float8_training_tensor import (
    Float8TrainingTensor,
    GemmInputRole,
    hp_tensor_and_scale_to_float8,
)
from torchao.float8.float8_utils import amax_to_scale, to_fp8_saturated

from torchtitan.float8.matmul import (
    Float8TensorwiseLinear,
    dynamic_cast,
    is_tensorwise,
    weight_in_float8,
)
from torchtitan.float8.transposed_cast import float8_cast_transposed, triton_kernels
from torchtitan.parallel.blocks import block_items

logger = logging.getLogger("torchtitan")

PROJECTIONS = ("w1", "w2", "w3")  # gate (under SiLU), down, up


def swiglu_grads_in_torch(dh: torch.Tensor, a1: torch.Tensor, a3: torch.Tensor):
    """(da1, da3, h): the SwiGLU's input gradients and its product, by eager's own ops (the
    kernels' reference)."""
    silu = F.silu(a1)
    da1 = torch.ops.aten.silu_backward(dh * a3, a1)
    return da1, dh * silu, silu * a3


@torch.library.custom_op("torchtitan::swiglu_float8_grad_amax", mutates_args=())
def swiglu_float8_grad_amax(dh: torch.Tensor, a1: torch.Tensor, a3: torch.Tensor) -> torch.Tensor:
    """``[max |da1|, max |da3|]`` (float32) for the gradient ``dh`` of ``silu(a1) * a3``."""
    kernel = _kernel_module(dh, a1, a3)
    if kernel is not None:
        return kernel.grad_amax(dh.contiguous(), a1.contiguous(), a3.contiguous())
    da1, da3, _ = swiglu_grads_in_torch(dh, a1, a3)
    return torch.stack([da1.abs().max(), da3.abs().max()]).float()


@swiglu_float8_grad_amax.register_fake
def _(dh, a1, a3):
    return dh.new_empty(2, dtype=torch.float32)


@torch.library.custom_op("torchtitan::swiglu_float8_grad_cast", mutates_args=())
def swiglu_float8_grad_cast(
    dh: torch.Tensor,
    a1: torch.Tensor,
    a3: torch.Tensor,
    amax: torch.Tensor,
    h_scale: torch.Tensor,
    grad_dtype: torch.dtype,
    input_dtype: torch.dtype,
    round_to_power_of_2: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(da1, da1ᵀ, da3, da3ᵀ, hᵀ, scales): the two gradients scaled by the scales of ``amax``
    (returned as ``scales``) and the product ``h`` by ``h_scale``, saturated to float8; each
    transposed one a new row-major tensor."""
    kernel = _kernel_module(dh, a1, a3)
    if kernel is not None:
        operands = (dh.contiguous(), a1.contiguous(), a3.contiguous())
        return kernel.grad_cast(
            *operands, amax, h_scale, grad_dtype, input_dtype, round_to_power_of_2
        )
    da1, da3, h = swiglu_grads_in_torch(dh, a1, a3)
    scales = amax_to_scale(amax, grad_dtype, round_to_power_of_2)
    g1 = to_fp8_saturated(da1.float() * scales[0], grad_dtype)
    g3 = to_fp8_saturated(da3.float() * scales[1], grad_dtype)
    h_t = to_fp8_saturated(h.float() * h_scale, input_dtype).t().contiguous()
    return g1, g1.t().contiguous(), g3, g3.t().contiguous(), h_t, scales


@swiglu_float8_grad_cast.register_fake
def _(dh, a1, a3, amax, h_scale, grad_dtype, input_dtype, round_to_power_of_2):
    return empty_operands(dh, grad_dtype, input_dtype)


def empty_operands(dh: torch.Tensor, grad_dtype: torch.dtype, input_dtype: torch.dtype):
    """Uninitialized (da1, da1ᵀ, da3, da3ᵀ, hᵀ, scales) for a (tokens x hidden) ``dh``."""
    tokens, hidden = dh.shape
    da1, da3 = (dh.new_empty((tokens, hidden), dtype=grad_dtype) for _ in range(2))
    da1_t, da3_t = (dh.new_empty((hidden, tokens), dtype=grad_dtype) for _ in range(2))
    h_t = dh.new_empty((hidden, tokens), dtype=input_dtype)
    return da1, da1_t, da3, da3_t, h_t, dh.new_empty(2, dtype=torch.float32)


def _kernel_module(*tensors: torch.Tensor):
    """The Triton kernels for bf16 CUDA tensors (they round like eager's bf16 ops) when Triton is
    installed, else None: the torch path (also under Triton's CPU interpreter, which rounds
    otherwise)."""
    usable = all(t.is_cuda and t.dtype == torch.bfloat16 for t in tensors)
    return triton_kernels("torchtitan.experimental.float8_swiglu_kernel") if usable else None


@torch._dynamo.allow_in_graph
class Float8SwiGLU(torch.autograd.Function):
    """``silu(x @ w1_t) * (x @ w3_t) @ w2_t`` with tensorwise float8 operands (see the module
    doc); the weights come transposed, as the linears pass them to their matmuls."""

    @staticmethod
    def forward(ctx, x, w1_t, w3_t, w2_t, mm_config, config, tiled: bool):
        x_2d = x.reshape(-1, x.shape[-1])
        x_fp8 = dynamic_cast(x_2d, config.cast_config_input, mm_config, GemmInputRole.INPUT, config)
        a1 = torch.mm(x_fp8, weight_in_float8(w1_t, mm_config, config))
        a3 = torch.mm(x_fp8, weight_in_float8(w3_t, mm_config, config))
        h = F.silu(a1) * a3
        h_fp8 = dynamic_cast(h, config.cast_config_input, mm_config, GemmInputRole.INPUT, config)
        out = torch.mm(h_fp8, weight_in_float8(w2_t, mm_config, config))
        ctx.save_for_backward(x, a1, a3, w1_t, w3_t, w2_t, x_fp8._scale, h_fp8._scale)
        ctx.mm_config, ctx.config, ctx.tiled = mm_config, config, tiled
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad_output):
        x, a1, a3, w1_t, w3_t, w2_t, x_scale, h_scale = ctx.saved_tensors
        mm_config, config = ctx.mm_config, ctx.config
        input_dtype = config.cast_config_input.target_dtype
        grad_dtype = config.cast_config_grad_output.target_dtype

        def operand(bits, scale, role, dtype=grad_output.dtype):
            return Float8TrainingTensor(bits, scale, dtype, mm_config, role)

        grad_fp8 = dynamic_cast(
            grad_output.reshape(-1, grad_output.shape[-1]),
            config.cast_config_grad_output,
            mm_config,
            GemmInputRole.GRAD_OUTPUT,
            config,
        )
        dh = torch.mm(grad_fp8, weight_in_float8(w2_t, mm_config, config).t())
        amax = swiglu_float8_grad_amax(dh, a1, a3)
        da1, da1_t, da3, da3_t, h_t, scales = swiglu_float8_grad_cast(
            dh, a1, a3, amax, h_scale, grad_dtype, input_dtype, config.round_scales_to_power_of_2
        )
        h_fp8 = operand(h_t.t(), h_scale, GemmInputRole.INPUT, a1.dtype)
        grad_w2 = torch.mm(grad_fp8.t(), h_fp8)
        grads_1 = operand(da1, scales[0], GemmInputRole.GRAD_OUTPUT)
        grads_3 = operand(da3, scales[1], GemmInputRole.GRAD_OUTPUT)
        grad_x = torch.mm(grads_1, weight_in_float8(w1_t, mm_config, config).t()) + torch.mm(
            grads_3, weight_in_float8(w3_t, mm_config, config).t()
        )
        x_2d = x.reshape(-1, x.shape[-1])
        if ctx.tiled:
            x_t = float8_cast_transposed(x_2d, x_scale, input_dtype)
            x_fp8 = operand(x_t.t(), x_scale, GemmInputRole.INPUT, x.dtype)
        else:  # the matmul transposes it; inductor fuses that into the kernel computing x
            x_fp8 = hp_tensor_and_scale_to_float8(
                x_2d, x_scale, input_dtype, mm_config, GemmInputRole.INPUT
            )
        grad_w1 = torch.mm(operand(da1_t, scales[0], GemmInputRole.GRAD_OUTPUT), x_fp8)
        grad_w3 = torch.mm(operand(da3_t, scales[1], GemmInputRole.GRAD_OUTPUT), x_fp8)
        grad_x = grad_x.reshape(x.shape)
        return grad_x, grad_w1.t(), grad_w3.t(), grad_w2.t(), None, None, None


class FusedFloat8SwiGLU:
    """Mixed into a feed-forward module's class by ``use_fused_swiglu``: its forward runs
    ``Float8SwiGLU`` (the module's own forward where that cannot run)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (getattr(self, name) for name in PROJECTIONS)
        weights = (w1.weight, w2.weight, w3.weight)
        if any(isinstance(t, DTensor) for t in (x, *weights)) or tensor_already_casted_to_fp8(x):
            return super().forward(x)
        if torch.is_autocast_enabled():  # as Float8Linear does: compute in autocast's dtype
            x = x.to(torch.get_autocast_gpu_dtype())
        weights_t = (w1.weight.t(), w3.weight.t(), w2.weight.t())
        return Float8SwiGLU.apply(
            x, *weights_t, w1.linear_mm_config, w1.config, w1.tiled_input_cast
        )


@functools.cache
def _fused_class(cls: type) -> type:
    return type(f"Float8SwiGLU{cls.__name__}", (FusedFloat8SwiGLU, cls), {})


def fusable(module: nn.Module) -> bool:
    """Whether ``module`` has w1/w2/w3 float8 linears of our tensorwise backward, without bias,
    with one configuration and w1 and w3 (which share their input's cast) both tiled or not (the
    forward must be ``w2(silu(w1(x)) * w3(x))``: the caller's knowledge of the model)."""
    linears = [getattr(module, name, None) for name in PROJECTIONS]
    if not all(type(m) is Float8TensorwiseLinear for m in linears):
        return False
    w1, _, w3 = linears
    return w1.tiled_input_cast == w3.tiled_input_cast and all(
        m.bias is None
        and m.own_backward
        and is_tensorwise(m.config)
        and m.config == w1.config
        and m.linear_mm_config == w1.linear_mm_config
        for m in linears
    )


def use_fused_swiglu(
    model: nn.Module, blocks_attr: str = "layers", ffn_attr: str = "feed_forward"
) -> int:
    """Make each block's ``ffn_attr`` module run ``Float8SwiGLU`` where ``fusable``; call after
    ``apply_float8`` and not under TP. Returns how many were changed (and logs it)."""
    changed = sum(
        fuse_swiglu(getattr(b, ffn_attr, None)) for _, b in block_items(model, blocks_attr)
    )
    logger.info("float8: the SwiGLU backward fused in %d feed-forwards", changed)
    return changed


def fuse_swiglu(ffn: nn.Module | None) -> bool:
    """Make one feed-forward module run ``Float8SwiGLU`` if ``fusable``; whether it was changed."""
    if ffn is None or isinstance(ffn, FusedFloat8SwiGLU) or not fusable(ffn):
        return False
    ffn.__class__ = _fused_class(type(ffn))
    return True
