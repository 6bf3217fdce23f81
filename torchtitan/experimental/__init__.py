"""Opt-in performance tricks, each off by default (the ``[experimental]`` config section).

Each one bought less than the bar a default must pay (>= 2 % tokens/s or >= 2 GiB on a headline
row, measured twice side by side); docs/performance.md says what each measured. Two seams call
into this package and nothing else imports it: the composition
(``torchtitan.parallel.compose``), through ``apply_experimental`` and ``experimental_problem``,
and the optimizer builder (``torchtitan.optim``), for the compiled AdamW.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from torchtitan.config import JobConfig

logger = logging.getLogger("torchtitan")


@dataclass
class FsdpExtras:
    """What the switches need from FSDP: parameters it must leave alone (the row-sharded
    embedding's) and a call once the blocks are sharded (the copy-engine all-gather)."""

    ignored_params: set[nn.Parameter] = field(default_factory=set)
    after_blocks_sharded: Callable[[list[nn.Module], DeviceMesh], None] | None = None


@dataclass(frozen=True)
class Where:
    """The run's shape, as the switches need it."""

    on_gpu: bool
    tp: int
    pp: int
    fsdp_degree: int
    data_parallel: bool


def experimental_problem(cfg: JobConfig, where: Where, gpus_per_node: int) -> str | None:
    """A one-line reason why a switch that is on cannot run, or None."""
    x = cfg.experimental
    if x.float8_fused_swiglu and not (cfg.float8.enable and cfg.float8.recipe == "tensorwise"):
        return "--experimental.float8_fused_swiglu needs --float8.enable with recipe tensorwise"
    if x.float8_fused_swiglu and where.tp > 1:
        return "--experimental.float8_fused_swiglu does not run under TP; turn it off"
    if x.fsdp_copy_engine_all_gather and where.on_gpu:
        from torchtitan.experimental.copy_engine_all_gather import copy_engine_problem

        return copy_engine_problem(where.fsdp_degree, where.tp, gpus_per_node, where.pp)
    return None


def apply_experimental(
    model: nn.Module,
    cfg: JobConfig,
    where: Where,
    fsdp_mesh: DeviceMesh | None,
    family,
) -> FsdpExtras:
    """Apply the switches that are on to ``model`` (after float8 conversion, before TP);
    returns what FSDP must do for them."""
    x = cfg.experimental
    extras = FsdpExtras()
    if x.float8_fused_swiglu and family.swiglu_attr:
        from torchtitan.experimental.float8_swiglu import use_fused_swiglu  # imports torchao

        use_fused_swiglu(model, family.blocks_attr, family.swiglu_attr)
    if where.data_parallel and where.on_gpu and x.fsdp_grad_copy_in_kernel:
        from torchtitan.experimental.grad_copy_in import use_triton_grad_copy_in

        use_triton_grad_copy_in(True)
    if x.fsdp_sharded_embedding and where.tp == 1 and where.fsdp_degree > 1:
        extras.ignored_params = _shard_embedding_rows(model, cfg, fsdp_mesh, family, where)
    if x.fsdp_copy_engine_all_gather and where.on_gpu and where.fsdp_degree > 1:
        extras.after_blocks_sharded = _copy_engine_all_gather
    return extras


def _shard_embedding_rows(model, cfg: JobConfig, mesh, family, where: Where) -> set:
    from torchtitan.dtypes import DTYPES
    from torchtitan.experimental.sharded_embedding import shard_embedding_rows

    t = cfg.training
    param = DTYPES[t.mixed_precision_param] if where.on_gpu else torch.float32
    reduce = DTYPES[t.mixed_precision_reduce] if where.on_gpu else torch.float32
    weights = shard_embedding_rows(model, family.input_modules, mesh, param, reduce)
    logger.info("FSDP: %d embeddings looked up where their rows live", len(weights))
    return weights


def _copy_engine_all_gather(blocks: list[nn.Module], mesh: DeviceMesh) -> None:
    from torchtitan.experimental.copy_engine_all_gather import use_copy_engine_all_gather

    use_copy_engine_all_gather(blocks, mesh.get_group(mesh.ndim - 1))
