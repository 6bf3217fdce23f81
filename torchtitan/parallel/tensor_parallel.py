"""Tensor + sequence parallelism from a plan: module FQN -> ParallelStyle.

A model brings two plans, one for its root (embeddings, final norm, head) and one applied to each
block; a family's are in ``torchtitan/models/<family>/parallelize.py``, a custom model's in
examples/parallelize_custom_model.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from torchtitan.parallel.blocks import block_items


def apply_tp(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    root_plan: dict[str, ParallelStyle],
    block_plan: dict[str, ParallelStyle] | Callable[[nn.Module], dict[str, ParallelStyle]],
    blocks_attr: str = "layers",
) -> None:
    """Apply ``root_plan`` to ``model`` and ``block_plan`` to each block (a callable gives each
    block its plan, e.g. one for dense and one for MoE blocks).

    Root-plan entries whose top-level module is absent (e.g. cut away by a pipeline split) are
    skipped; nested keys ("head.proj") and wildcards are passed on to ``parallelize_module``.
    Tied parameters (an embedding shared with the head) stay tied: the styles replace each
    module's parameter, so the later owners get the first one's again (their plans must place
    it alike, as Rowwise embedding and Colwise head both shard the vocabulary rows).
    """
    present = {
        k: v for k, v in root_plan.items() if getattr(model, k.split(".")[0], None) is not None
    }
    ties = _tied_owners(model)
    parallelize_module(model, tp_mesh, present)
    for owners in ties:
        (first, name), rest = owners[0], owners[1:]
        for module, other in rest:
            setattr(module, other, getattr(first, name))
    for _, block in block_items(model, blocks_attr):
        plan = block_plan(block) if callable(block_plan) else block_plan
        parallelize_module(block, tp_mesh, plan)


def _tied_owners(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """(module, attribute) of each parameter that several modules hold, one list per parameter."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            owners.setdefault(id(param), []).append((module, name))
    return [found for found in owners.values() if len(found) > 1]


def check_tp_degree(n_heads: int, n_kv_heads: int, seq_len: int, tp: int) -> str | None:
    """A one-line reason why this model cannot use ``tp``, or None."""
    if n_heads % tp or n_kv_heads % tp:
        return (
            f"tensor_parallel_degree={tp} must divide n_heads={n_heads} and n_kv_heads={n_kv_heads}"
        )
    if seq_len % tp:
        return f"tensor_parallel_degree={tp} must divide training.seq_len={seq_len} (for SP)"
    return None


def enable_async_tp(tp_mesh: DeviceMesh) -> None:
    """Let inductor overlap TP's all-gather/reduce-scatter with the matmuls (CUDA + compile):
    its micro-pipeline pass replaces them with fused symmetric-memory ops.

    The pass fuses only the collectives of groups registered for symmetric memory
    (``is_symm_mem_enabled_for_group``), so the TP group is registered although torch 2.13
    deprecates the call ("no need to call this function anymore"); without it the pass left
    every collective alone (docs/performance.md).
    """
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    inductor_config._micro_pipeline_tp = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        enable_symm_mem_for_group(tp_mesh.get_group().group_name)


def plain_loss(loss: torch.Tensor) -> torch.Tensor:
    """Loss parallel returns the loss as a DTensor replicated over TP (the same value on every TP
    rank); -> that value as a plain tensor, which any other loss already is."""
    return loss.full_tensor() if isinstance(loss, DTensor) else loss
