"""Context parallelism (CP): ring attention over the sequence dimension.

PyTorch's CP (``torch.distributed.tensor.experimental.context_parallel``) shards the input ids,
labels and the RoPE cache along the sequence on every CP rank and replaces causal SDPA by ring
attention. Upstream only knows the CUDA SDPA kernels (flash, efficient, cuDNN); on CPU,
``F.scaled_dot_product_attention`` dispatches to
``aten._scaled_dot_product_flash_attention_for_cpu`` and stock CP fails with "... does not have a
sharding strategy registered".
:func:`enable_cpu_context_parallel` teaches CP that kernel: a sequence-sharded (``Shard(2)``)
sharding strategy for the forward and backward ops, and custom DTensor op handlers that run CP's
own ring-attention templates with the CPU kernels.

Private PyTorch symbols used (checked against torch 2.13; a missing one raises a clear error):
``_context_parallel._attention.{custom_ops, _templated_ring_attention,
_templated_ring_attention_backward, _cp_options, set_rotate_method}``, ``DTensor._op_dispatcher``,
``torch.distributed.tensor._ops.utils.{register_op_strategy, expand_to_full_mesh_op_strategy}``
and ``torch.distributed.tensor._op_schema.RuntimeSchemaInfo``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

aten = torch.ops.aten

_ROTATE_METHODS = ("allgather", "alltoall")
_SEQ_DIM = 2  # q, k, v are (batch, heads, seq, head_dim) when they reach SDPA
_enabled = False


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


def _cp_module():
    """CP's implementation module (``_context_parallel._attention`` in torch >= 2.9)."""
    for name in (
        "torch.distributed.tensor.experimental._context_parallel._attention",
        "torch.distributed.tensor.experimental._attention",
    ):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise RuntimeError(
        f"context parallelism: no PyTorch CP module found in torch {torch.__version__}"
    )


def _private(module: Any, name: str) -> Any:
    if not hasattr(module, name):
        raise RuntimeError(
            f"context parallelism on CPU needs the private symbol {module.__name__}.{name}, which "
            f"torch {torch.__version__} does not have; this shim was written against torch 2.13"
        )
    return getattr(module, name)


def enable_cpu_context_parallel() -> None:
    """Teach PyTorch's CP the CPU flash-attention kernel (idempotent).

    After this, ``context_parallel(...)`` (and the newer ``_ContextParallel`` API) work on CPU
    meshes, with either rotate method and with or without load balancing.
    """
    global _enabled
    if _enabled:
        return
    from torch.distributed.tensor import DTensor, Replicate, Shard

    cp = _cp_module()
    ring_fwd = _private(cp, "_templated_ring_attention")
    ring_bwd = _private(cp, "_templated_ring_attention_backward")
    custom_ops = _private(cp, "custom_ops")
    _private(cp, "_cp_options")
    try:
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
        from torch.distributed.tensor._ops.utils import (
            expand_to_full_mesh_op_strategy,
            register_op_strategy,
        )
    except ImportError as e:
        raise RuntimeError(
            f"context parallelism on CPU: torch {torch.__version__} lacks a DTensor internal "
            f"this shim needs ({e}); it was written against torch 2.13"
        ) from e
    dispatcher = DTensor._op_dispatcher
    for attr in ("unwrap_to_op_info", "wrap", "sharding_propagator", "_custom_op_handlers"):
        _private(dispatcher, attr)

    fwd_op = aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd_op = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def cp_active() -> bool:
        # CP merges ``custom_ops`` into the dispatcher's handlers only while a CP context is on.
        return dispatcher._custom_op_handlers.get(fwd_op) is handler

    def strategies(n: int) -> list[list[Any]]:
        # Outputs then the tensor inputs, all sharded alike: replicate, batch, heads, and (only
        # inside a CP context, like upstream's CP rules) the sequence for ring attention.
        out = [[Replicate()] * n, [Shard(0)] * n, [Shard(1)] * n]
        if cp_active():
            out.append([Shard(_SEQ_DIM)] * n)
        return out

    def fwd_strategy(op_schema):
        # (output, logsumexp) + (q, k, v); an attn_mask is not supported by CP.
        mesh = op_schema.get_mesh_from_args()
        return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies(5), input_index=2)

    def bwd_strategy(op_schema):
        # (grad_q, grad_k, grad_v) + (grad_out, q, k, v, out, logsumexp)
        mesh = op_schema.get_mesh_from_args(validate=False)
        return expand_to_full_mesh_op_strategy(mesh, op_schema, strategies(9), input_index=3)

    register_op_strategy(fwd_op, schema_info=RuntimeSchemaInfo(3))(fwd_strategy)
    register_op_strategy(bwd_op, schema_info=RuntimeSchemaInfo(6))(bwd_strategy)

    def ring_forward(group, query, key, value, dropout_p=0.0, is_causal=False, **kw):
        if kw.get("attn_mask") is not None:
            raise NotImplementedError("context parallel SDPA does not support attn_mask")
        if dropout_p:
            raise NotImplementedError("context parallel SDPA does not support dropout")
        return ring_fwd(
            group,
            _SEQ_DIM,
            fwd_op,
            query=query,
            key=key,
            value=value,
            is_causal=is_causal,
            scale=kw.get("scale"),
        )

    def ring_backward(
        group, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, **kw
    ):
        return ring_bwd(
            group,
            _SEQ_DIM,
            bwd_op,
            grad_out=grad_out,
            grad_out_name="grad_out",
            query=query,
            key=key,
            value=value,
            out=out,
            logsumexp=logsumexp,
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=kw.get("scale"),
        )

    ring = {fwd_op: ring_forward, bwd_op: ring_backward}

    def handler(op_call, args, kwargs):
        info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
        dispatcher.sharding_propagator.propagate(info)
        sharding = info.output_sharding
        if sharding is None or sharding.needs_redistribute:
            raise RuntimeError(
                f"context parallel SDPA: {op_call} inputs are not sharded on the sequence dim"
            )
        spec = sharding.output_spec
        placements = (spec[0] if isinstance(spec, (tuple, list)) else spec).placements
        if not any(isinstance(p, Shard) and p.dim == _SEQ_DIM for p in placements):
            # Not sequence sharded (e.g. replicated): plain local attention is correct.
            local = op_call(*info.local_args, **info.local_kwargs)
        else:
            group = info.compute_mesh.get_group()
            local = ring[op_call](group, *info.local_args, **info.local_kwargs)
        return dispatcher.wrap(local, spec)

    custom_ops[fwd_op] = handler
    custom_ops[bwd_op] = handler
    _enabled = True


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
    if rotate_method not in _ROTATE_METHODS:
        raise ValueError(f"rotate_method must be one of {_ROTATE_METHODS}; got {rotate_method!r}")
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

    cp = _cp_module()
    options, set_rotate_method = _private(cp, "_cp_options"), _private(cp, "set_rotate_method")
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
