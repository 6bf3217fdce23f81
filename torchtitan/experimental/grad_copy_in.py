"""FSDP2's reduce-scatter copy-in as one Triton kernel per gradient.

Before each reduce-scatter, FSDP2 lays a block's gradients out rank by rank in one buffer of the
reduce dtype (``foreach_reduce_scatter_copy_in``: rank r's part holds the r-th chunk along dim 0
of every gradient, one after the other), casting bf16 gradients to float32 on the way. It runs on
the compute stream, between one block's backward and the next. Torch's kernel for it
(``torch._chunk_cat``) moved an 8B block's 218 M gradients (1.3 GB read and written) at 2.0 TB/s
on an H200 (0.645 ms), as did a plain contiguous bf16 -> float32 copy; this kernel, one program
per 1,024 elements of one rank's chunk, at 3.8 TB/s (0.345 ms; benchmarks/tools/
reduce_scatter_copy_in.py, 2026-11-29). Same bytes (tests/unit/test_grad_copy_in.py).

``use_triton_grad_copy_in(True)`` replaces FSDP2's function by :func:`copy_in`, for every FSDP
module of the process (``--experimental.fsdp_grad_copy_in_kernel``); gradients it does not
handle (not on a GPU, not contiguous, dim 0 not a multiple of the world size, which FSDP pads, or a
cast that
rounds, e.g. float32 gradients into a bf16 buffer) go to FSDP's own function.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os

import torch

try:  # private: where FSDP2 keeps the function this replaces
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives
except ImportError:
    _fsdp_collectives = None

logger = logging.getLogger("torchtitan")

FSDP_COPY_IN = getattr(_fsdp_collectives, "foreach_reduce_scatter_copy_in", None)
EXPECTED_PARAMETERS = ["unsharded_grads", "reduce_scatter_input", "world_size"]
BLOCK = 1024  # elements per program: the fastest of 1,024, 4,096 and 16,384 (H200, 2026-11-29)
WIDENS_EXACTLY = (torch.bfloat16, torch.float16)  # into float32: every value kept
_FALLBACK_NOTED = False


def fsdp_copy_in_problem() -> str | None:
    """Why FSDP's copy-in cannot be replaced in this torch, or None."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if FSDP_COPY_IN is None:
        return f"torch {torch.__version__}'s FSDP has no foreach_reduce_scatter_copy_in"
    if list(inspect.signature(FSDP_COPY_IN).parameters) != EXPECTED_PARAMETERS:
        return f"torch {torch.__version__}'s foreach_reduce_scatter_copy_in takes other arguments"
    return None


def use_triton_grad_copy_in(enable: bool) -> bool:
    """Route FSDP2's reduce-scatter copy-in through :func:`copy_in` (or back to FSDP's own);
    -> whether it now is. Process-wide."""
    problem = fsdp_copy_in_problem()
    if enable and problem:
        logger.warning("FSDP gradient copy-in: FSDP's own (%s)", problem)
        return False
    if problem is None:
        _fsdp_collectives.foreach_reduce_scatter_copy_in = copy_in if enable else FSDP_COPY_IN
    return enable


def handled(grads: list[torch.Tensor], out: torch.Tensor, world_size: int) -> bool:
    """Whether :func:`copy_in` lays these out itself: on a GPU (or under Triton's interpreter,
    the CPU tests), contiguous, dim 0 a multiple of the world size, and a cast that is exact
    (to the same dtype, or bf16/fp16 to float32), so no rounding of ours can differ from
    torch's."""
    on_gpu = out.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    return on_gpu and all(
        g.is_contiguous()
        and g.numel() > 0
        and g.shape[0] % world_size == 0
        and (out.dtype == g.dtype or (out.dtype == torch.float32 and g.dtype in WIDENS_EXACTLY))
        for g in grads
    )


def _note_fallback(grads: list[torch.Tensor], out: torch.Tensor, world_size: int) -> None:
    """Log once per process that a group went to FSDP's copy-in, and why (the trainer's log
    says the Triton kernel is on)."""
    global _FALLBACK_NOTED
    if _FALLBACK_NOTED or not out.is_cuda:
        return
    _FALLBACK_NOTED = True
    shapes = ", ".join(f"{tuple(g.shape)} {str(g.dtype).split('.')[-1]}" for g in grads[:4])
    logger.info(
        "FSDP gradient copy-in: FSDP's own for gradients the kernel does not take (dim 0 not a "
        "multiple of %d ranks, a rounding cast into %s, or not contiguous), e.g. %s",
        world_size,
        str(out.dtype).split(".")[-1],
        shapes,
    )


def copy_in(grads: list[torch.Tensor], out: torch.Tensor, world_size: int) -> None:
    """FSDP's ``foreach_reduce_scatter_copy_in(unsharded_grads, reduce_scatter_input,
    world_size)``: ``out`` (flat, the reduce dtype) gets rank r's chunk of every gradient in
    its r-th part."""
    if not handled(grads, out, world_size):
        _note_fallback(grads, out, world_size)
        FSDP_COPY_IN(grads, out, world_size)
        return
    lay_out(grads, out, world_size)


def lay_out(grads: list[torch.Tensor], out: torch.Tensor, world_size: int, block: int = BLOCK):
    """The kernel's part of :func:`copy_in`, for gradients it handles; ``block`` elements per
    program (benchmarks/tools/reduce_scatter_copy_in.py tries others)."""
    from torchtitan.experimental.grad_copy_in_kernel import copy_chunks

    parts = out.view(world_size, -1)
    offset = 0
    for grad in grads:
        chunk = grad.numel() // world_size
        copy_chunks(grad, parts[:, offset:], chunk, parts.stride(0), block)
        offset += chunk
