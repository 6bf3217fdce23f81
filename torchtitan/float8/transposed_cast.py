"""``float8_cast_transposed``: a tensorwise float8 cast that writes its output transposed, as an
operator inductor cannot fuse into other kernels.

The weight-gradient matmul of a float8 linear takes its input in column-major float8. When the
linear's input is a norm's output, the compiled backward recomputes that output inside the norm
backward's row reduction, and inductor fuses the transposed cast into the same kernel, where
every store is a single byte a whole row away from the next (8B Float8 block: 1.76 of 18 ms,
docs/performance.md). Behind this operator the norm output is written row-major and
a tiled kernel transposes it (``cast_kernel.py``, CUDA) or torchao's own cast and a transpose
do (CPU and emulation).

Where the compiled step runs it: the partitioner may not recompute an operator it does not know,
so without activation checkpointing it runs the cast in the forward, once per norm output (the
linears sharing an input share the cast), and keeps the float8 result for the backward: one byte
per element of each norm output more than torchao's backward keeps. Under selective or full
checkpointing it runs in the backward's recompute and keeps nothing more.

The numerics are torchao's cast (``x.float() * scale``, clamped to the format's largest finite
value, rounded to nearest), so the result is bit for bit what torchao's backward computes.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

import torch
from torchao.float8.float8_utils import to_fp8_saturated


@torch.library.custom_op("torchtitan::float8_cast_transposed", mutates_args=())
def float8_cast_transposed(
    x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype
) -> torch.Tensor:
    """``x`` (rows x cols) times ``scale``, saturated to ``float8_dtype``, as a row-major
    (cols x rows) tensor: ``result.t()`` is the column-major float8 operand."""
    kernel = kernel_module(x)
    if kernel is not None:
        return kernel.cast_transposed(
            x if x.stride(1) == 1 else x.contiguous(), scale, float8_dtype
        )
    return to_fp8_saturated(x.to(torch.float32) * scale, float8_dtype).t().contiguous()


@float8_cast_transposed.register_fake
def _(x: torch.Tensor, scale: torch.Tensor, float8_dtype: torch.dtype):
    return x.new_empty((x.shape[1], x.shape[0]), dtype=float8_dtype)


def kernel_module(x: torch.Tensor):
    """The Triton kernel module for CUDA tensors when Triton is installed; None for the torch
    path. Not under Triton's CPU interpreter: it rounds some values to float8 differently from
    the GPU (126.7 to 64 instead of 128 in e4m3), so it cannot stand in for the kernel."""
    return triton_kernels("torchtitan.float8.cast_kernel") if x.is_cuda else None


@functools.cache
def triton_kernels(module: str):
    """The module of Triton kernels named ``module`` (its full name); None without Triton."""
    if importlib.util.find_spec("triton") is None:
        return None
    return importlib.import_module(module)
