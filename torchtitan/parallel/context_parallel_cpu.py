"""Context parallelism on CPU: teach PyTorch's CP the CPU flash-attention kernel.

PyTorch's CP (``torch.distributed.tensor.experimental.context_parallel``) only knows the CUDA SDPA
kernels (flash, efficient, cuDNN). On CPU, ``F.scaled_dot_product_attention`` dispatches to
``aten._scaled_dot_product_flash_attention_for_cpu`` and stock CP fails with "... does not have a
sharding strategy registered". :func:`enable_cpu_context_parallel` registers a sequence-sharded
(``Shard(2)``) sharding strategy for that op and its backward, and a DTensor op handler that runs
CP's own ring-attention templates with the CPU kernels.

Private PyTorch symbols used (checked against torch 2.13; a missing one raises a clear error):
``_context_parallel._attention.{custom_ops, _templated_ring_attention,
_templated_ring_attention_backward, _cp_options, set_rotate_method}``, ``DTensor._op_dispatcher``,
``torch.distributed.tensor._ops.utils.{register_op_strategy, expand_to_full_mesh_op_strategy}``
and ``torch.distributed.tensor._op_schema.RuntimeSchemaInfo``.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

aten = torch.ops.aten

FORWARD_OP = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD_OP = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
SEQ_DIM = 2  # q, k, v are (batch, heads, seq, head_dim) when they reach SDPA
_OP_UTILS = "torch.distributed.tensor._ops.utils"
_OP_SCHEMA = "torch.distributed.tensor._op_schema"
_CP_MODULES = (
    "torch.distributed.tensor.experimental._context_parallel._attention",  # torch >= 2.9
    "torch.distributed.tensor.experimental._attention",
)


@functools.cache
def torch_cp_module() -> ModuleType:
    """PyTorch's CP implementation module (looked up once: the ring handlers ask on every
    attention call)."""
    for name in _CP_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise RuntimeError(
        f"context parallelism: no PyTorch CP module found in torch {torch.__version__}"
    )


def torch_private(module: ModuleType | str, name: str) -> Any:
    """``module.name`` (``module``: an object or an import path), or an error naming what is
    missing."""
    where = (
        module if isinstance(module, str) else getattr(module, "__name__", type(module).__name__)
    )
    try:
        if isinstance(module, str):
            module = importlib.import_module(module)
        return getattr(module, name)
    except (ImportError, AttributeError):
        raise RuntimeError(
            f"context parallelism needs the private symbol {where}.{name}, which torch "
            f"{torch.__version__} does not have; torchtitan's CP was written against torch 2.13"
        ) from None


def _cp_active() -> bool:
    # CP merges ``custom_ops`` into the dispatcher's handlers only while a CP context is on.
    return DTensor._op_dispatcher._custom_op_handlers.get(FORWARD_OP) is handle_cpu_sdpa


def _placements(n: int) -> list[list[Any]]:
    """Outputs then the tensor inputs, all sharded alike: replicate, batch, heads, and (only
    inside a CP context, like upstream's CP rules) the sequence for ring attention."""
    out = [[Replicate()] * n, [Shard(0)] * n, [Shard(1)] * n]
    if _cp_active():
        out.append([Shard(SEQ_DIM)] * n)
    return out


def _forward_strategy(op_schema):
    # (output, logsumexp) + (q, k, v); an attn_mask is not supported by CP.
    expand = torch_private(_OP_UTILS, "expand_to_full_mesh_op_strategy")
    mesh = op_schema.get_mesh_from_args()
    return expand(mesh, op_schema, _placements(5), input_index=2)


def _backward_strategy(op_schema):
    # (grad_q, grad_k, grad_v) + (grad_out, q, k, v, out, logsumexp)
    expand = torch_private(_OP_UTILS, "expand_to_full_mesh_op_strategy")
    mesh = op_schema.get_mesh_from_args(validate=False)
    return expand(mesh, op_schema, _placements(9), input_index=3)


def _ring_forward(group, query, key, value, dropout_p=0.0, is_causal=False, **kw):
    if kw.get("attn_mask") is not None:
        raise NotImplementedError("context parallel SDPA does not support attn_mask")
    if dropout_p:
        raise NotImplementedError("context parallel SDPA does not support dropout")
    ring = torch_private(torch_cp_module(), "_templated_ring_attention")
    return ring(
        group,
        SEQ_DIM,
        FORWARD_OP,
        query=query,
        key=key,
        value=value,
        is_causal=is_causal,
        scale=kw.get("scale"),
    )


def _ring_backward(group, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, **kw):
    ring = torch_private(torch_cp_module(), "_templated_ring_attention_backward")
    return ring(
        group,
        SEQ_DIM,
        BACKWARD_OP,
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


_RING = {FORWARD_OP: _ring_forward, BACKWARD_OP: _ring_backward}


def handle_cpu_sdpa(op_call, args, kwargs):
    """DTensor handler for the CPU flash-attention ops (forward and backward) under CP: ring
    attention when q, k, v are sharded on the sequence, the local kernel otherwise."""
    dispatcher = DTensor._op_dispatcher
    info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    dispatcher.sharding_propagator.propagate(info)
    sharding = info.output_sharding
    if sharding is None or sharding.needs_redistribute:
        raise RuntimeError(
            f"context parallel SDPA: {op_call} inputs are not sharded on the sequence dim"
        )
    spec = sharding.output_spec
    placements = (spec[0] if isinstance(spec, (tuple, list)) else spec).placements
    if not any(isinstance(p, Shard) and p.dim == SEQ_DIM for p in placements):
        # Not sequence sharded (e.g. replicated): plain local attention is correct.
        local = op_call(*info.local_args, **info.local_kwargs)
    else:
        group = info.compute_mesh.get_group()
        local = _RING[op_call](group, *info.local_args, **info.local_kwargs)
    return dispatcher.wrap(local, spec)


def _check_private_symbols(cp: ModuleType) -> None:
    """Fail now, in one line, rather than inside a training step."""
    for name in ("_templated_ring_attention", "_templated_ring_attention_backward", "_cp_options"):
        torch_private(cp, name)
    torch_private(_OP_UTILS, "expand_to_full_mesh_op_strategy")
    for name in ("unwrap_to_op_info", "wrap", "sharding_propagator", "_custom_op_handlers"):
        torch_private(DTensor._op_dispatcher, name)


def enable_cpu_context_parallel() -> None:
    """Teach PyTorch's CP the CPU flash-attention kernel; later calls do nothing.

    After this, ``context_parallel(...)`` (and the newer ``_ContextParallel`` API) work on CPU
    meshes, with either rotate method and with or without load balancing.
    """
    cp = torch_cp_module()
    custom_ops = torch_private(cp, "custom_ops")
    if custom_ops.get(FORWARD_OP) is handle_cpu_sdpa:  # PyTorch's registry says: done already
        return
    _check_private_symbols(cp)
    schema_info = torch_private(_OP_SCHEMA, "RuntimeSchemaInfo")
    register_op_strategy = torch_private(_OP_UTILS, "register_op_strategy")
    register_op_strategy(FORWARD_OP, schema_info=schema_info(3))(_forward_strategy)
    register_op_strategy(BACKWARD_OP, schema_info=schema_info(6))(_backward_strategy)
    custom_ops[FORWARD_OP] = handle_cpu_sdpa
    custom_ops[BACKWARD_OP] = handle_cpu_sdpa
