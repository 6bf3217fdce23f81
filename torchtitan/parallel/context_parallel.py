"""Context parallelism (CP): ring attention over the sequence dimension.

PyTorch's CP (``torch.distributed.tensor.experimental.context_parallel``) shards the input ids,
labels and the RoPE cache along the sequence on every CP rank and replaces causal SDPA by ring
attention. Upstream only knows the CUDA SDPA kernels; on a CPU mesh :func:`cp_context` first
teaches it the CPU kernel (``context_parallel_cpu.py``, which also lists the private PyTorch
symbols CP needs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh

from torchtitan.config import RotateMethod, choices
from torchtitan.parallel.context_parallel_cpu import (
    enable_cpu_context_parallel,
    torch_cp_module,
    torch_private,
)

ROTATE_METHODS = choices(RotateMethod)


def check_cp(seq_len: int, cp: int) -> str | None:
    """Why ``seq_len`` cannot be split over ``cp`` context-parallel ranks, or None if it can.

    Load balancing cuts the sequence into ``2 * cp`` chunks (each rank gets one from the head and
    one from the tail), so the sequence length must be divisible by ``2 * cp``.
    """
    if cp < 1:
        return f"the context parallel degree must be >= 1; got {cp}"
    if cp > 1 and seq_len % (2 * cp):
        return (
            f"seq_len {seq_len} must be divisible by 2 * context_parallel_degree = {2 * cp} "
            "(load-balanced context parallelism splits the sequence into 2 * cp chunks)"
        )
    return None


@contextlib.contextmanager
def cp_context(
    cp_mesh: DeviceMesh,
    buffers: Sequence[torch.Tensor],
    seq_dims: Sequence[int],
    rotate_method: str = "allgather",
    load_balance: bool = True,
) -> Iterator[None]:
    """Run forward + loss + backward with context parallelism over ``cp_mesh`` (1-D).

    ``buffers`` (e.g. ``[inputs, labels, model.rope_cache]`` with ``seq_dims`` ``[1, 1, 0]``) are
    sharded in place along their sequence dims and restored on exit; all must have the same
    sequence length (so a RoPE cache longer than the batch's sequence must be cut to it first).
    Inside, causal ``F.scaled_dot_product_attention`` becomes ring attention. With
    ``load_balance`` each rank holds chunks ``r`` and ``2*cp-1-r`` of ``2*cp``.
    """
    from torch.distributed.tensor.experimental import context_parallel

    if cp_mesh.ndim != 1:
        raise ValueError(f"cp_context needs a 1-D CP mesh; got {cp_mesh.ndim}-D")
    if rotate_method not in ROTATE_METHODS:
        raise ValueError(f"rotate_method must be one of {ROTATE_METHODS}; got {rotate_method!r}")
    buffers, seq_dims = list(buffers), list(seq_dims)
    if not buffers or len(buffers) != len(seq_dims):
        raise ValueError("cp_context needs buffers and one seq dim per buffer")
    lengths = [b.shape[d] for b, d in zip(buffers, seq_dims, strict=True)]
    if len(set(lengths)) != 1:
        raise ValueError(
            f"CP buffers must share one sequence length; got {lengths} along dims {seq_dims} "
            "(cut the RoPE cache to the training seq_len, e.g. model max_seq_len = seq_len)"
        )
    if reason := check_cp(lengths[0], cp_mesh.size()):
        raise ValueError(reason)
    if cp_mesh.device_type == "cpu":
        enable_cpu_context_parallel()

    cp = torch_cp_module()
    options = torch_private(cp, "_cp_options")
    set_rotate_method = torch_private(cp, "set_rotate_method")
    old_balance, old_rotate = options.enable_load_balance, options.rotate_method
    # context_parallel() picks the head-tail load balancer iff enable_load_balance is set (and
    # seq_len % (2 * cp) == 0), and restores the flag on exit; we restore both to be safe.
    options.enable_load_balance = load_balance
    set_rotate_method(rotate_method)
    try:
        with context_parallel(cp_mesh, buffers=buffers, buffer_seq_dims=seq_dims):
            yield
    finally:
        options.enable_load_balance, options.rotate_method = old_balance, old_rotate
