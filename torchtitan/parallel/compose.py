"""``parallelize``: every parallelism the config asks for, applied to a (meta-device) model or
pipeline stage of any model family, in order.

Order: float8 linears -> the experimental switches -> TP/SP (+ loss parallel, async TP, float8
shard scales) -> expert parallel -> activation checkpointing -> per-block compile -> FSDP2 (or
HSDP / DDP; the MoE layers' own groups first).
Float8 conversion swaps modules, which the TP styles and FSDP then wrap. TP comes before the
rest because it replaces parameters with DTensors that AC, compile and FSDP then see; compile
wraps the checkpointed blocks (except whole-block checkpointing under TP, which goes around the
compiled block: see ``_checkpoint_and_compile``); FSDP wraps the compiled blocks, so its hooks
stay outside the compiled graphs. The caller then materializes (``to_empty``) and initializes.

The family (``torchtitan.models.common.ModelFamily``) says where the blocks, embeddings and head
live and brings its TP plans; nothing here names a family's modules.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from torchtitan import experimental, float8
from torchtitan.dtypes import DTYPES
from torchtitan.parallel.activation_checkpoint import apply_ac, checkpoints_whole_blocks
from torchtitan.parallel.compile import apply_compile
from torchtitan.parallel.expert_parallel import (
    apply_expert_parallel,
    fully_shard_moe_layers,
    has_moe,
)
from torchtitan.parallel.fsdp import apply_fsdp, reshard_after_forward
from torchtitan.parallel.tensor_parallel import apply_tp, enable_async_tp

if TYPE_CHECKING:
    from torchtitan.config import JobConfig
    from torchtitan.models.common import ModelFamily
    from torchtitan.parallel.dims import ParallelDims


def parallelize(
    model: nn.Module, family: ModelFamily, dims: ParallelDims, cfg: JobConfig, device_type: str
) -> nn.Module:
    """Apply every parallelism the config asks for to ``model`` in place; returns it."""
    where = _where(dims, device_type == "cuda")
    if cfg.float8.enable:  # first: TP styles and FSDP wrap the swapped-in Float8Linear modules
        f8 = cfg.float8
        exclude, tiled = family.float8_exclude, family.float8_tiled_cast
        float8.apply_float8(model, f8, dims.fsdp_degree > 1, exclude, tiled)
    fsdp_mesh = dims.fsdp_mesh if dims.data_parallel else None
    extras = experimental.apply_experimental(model, cfg, where, fsdp_mesh, family)
    if dims.tp > 1:
        _tensor_parallel(model, family, dims, cfg)
    moe_meshes = dims.moe_meshes() if has_moe(model) and (dims.ep > 1 or dims.tp > 1) else None
    if dims.ep > 1:
        apply_expert_parallel(model, moe_meshes.ep)
    _checkpoint_and_compile(model, family, dims, cfg)
    t, on_gpu = cfg.training, where.on_gpu
    param_dtype = DTYPES[t.mixed_precision_param] if on_gpu else torch.float32
    reduce_dtype = DTYPES[t.mixed_precision_reduce] if on_gpu else torch.float32
    if moe_meshes is not None:
        fully_shard_moe_layers(
            model,
            experts_mesh=moe_meshes.experts_fsdp if dims.ep > 1 else None,
            dense_mesh=moe_meshes.dense_fsdp if dims.tp > 1 else None,
            mp_policy=MixedPrecisionPolicy(param_dtype, reduce_dtype, cast_forward_inputs=False),
            reshard=reshard_after_forward(cfg.parallelism.fsdp_reshard_after_forward, dims.pp > 1),
            divide_factor=dims.dp_replicate * dims.fsdp_degree,
        )
    if dims.data_parallel:
        apply_fsdp(
            model,
            fsdp_mesh,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            reshard_policy=cfg.parallelism.fsdp_reshard_after_forward,
            pipeline_parallel=dims.pp > 1,
            blocks_attr=family.blocks_attr,
            input_group=family.input_modules,
            output_group=family.output_modules,
            ignored_params=extras.ignored_params,
            after_blocks_sharded=extras.after_blocks_sharded,
        )
    return model


def _tensor_parallel(model: nn.Module, family: ModelFamily, dims: ParallelDims, cfg: JobConfig):
    p = cfg.parallelism
    root_plan = family.root_tp_plan(not p.disable_loss_parallel)
    dense_plan = family.block_tp_plan()
    moe_plan = family.moe_block_tp_plan() if family.moe_block_tp_plan else None

    def plan_of(block: nn.Module):
        return moe_plan if moe_plan is not None and has_moe(block) else dense_plan

    apply_tp(model, dims.mesh("tp"), root_plan, plan_of, family.blocks_attr)
    if float8.scales_tp_shards(cfg.float8):
        float8.scale_float8_by_shard(model, family.blocks_attr)
    if p.enable_async_tensor_parallel:
        enable_async_tp(dims.mesh("tp"))


def _checkpoint_and_compile(
    model: nn.Module, family: ModelFamily, dims: ParallelDims, cfg: JobConfig
) -> None:
    ac, blocks = cfg.activation_checkpoint, family.blocks_attr
    if float8.recompute_must_round_like_forward(
        cfg.float8, cfg.compile.enable, ac.mode, ac.selective_ac_option
    ):
        float8.round_recompute_like_forward()
    # torch 2.13 fails to run a compiled block that fully checkpoints DTensor ops ("expected all
    # tensors_saved_with_vc_check to be Tensors": the TP mesh the recompute needs is saved among
    # the tensors), so under TP full checkpointing wraps the compiled block instead.
    outside = (
        cfg.compile.enable
        and dims.tp > 1
        and checkpoints_whole_blocks(ac.mode, ac.selective_ac_option)
    )
    if not outside:
        apply_ac(model, ac.mode, ac.selective_ac_option, blocks, ac.save_matmuls)
    if cfg.compile.enable:
        apply_compile(
            model,
            blocks,
            clone_first_input=dims.tp > 1,
            in_place=outside,
            reorder_collectives=cfg.compile.reorder_collectives,
            # The token exchange reads its split sizes on the host: a graph break per MoE layer.
            fullgraph=dims.ep == 1,
            tune_kernels=cfg.compile.tune_kernels,
        )
    if outside:
        apply_ac(model, ac.mode, ac.selective_ac_option, blocks, ac.save_matmuls)


def _where(dims: ParallelDims, on_gpu: bool) -> experimental.Where:
    return experimental.Where(
        on_gpu=on_gpu,
        tp=dims.tp,
        pp=dims.pp,
        fsdp_degree=dims.fsdp_degree,
        data_parallel=dims.data_parallel,
    )


def experimental_problem(cfg: JobConfig, dims: ParallelDims) -> str | None:
    """Preflight's check of the experimental switches (one line, or None)."""
    on_gpu = torch.cuda.is_available()
    gpus = int(os.environ.get("LOCAL_WORLD_SIZE", torch.cuda.device_count() if on_gpu else 1))
    return experimental.experimental_problem(cfg, _where(dims, on_gpu), gpus)
