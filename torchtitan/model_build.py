"""This rank's model: the meta-device model of its family, split into pipeline stages when pp > 1,
parallelized, materialized and initialized; and the seed checkpoint's whole model."""

from __future__ import annotations

import logging
import time

import torch
import torch.nn as nn

from torchtitan import runtime
from torchtitan.checkpoint import save_seed_checkpoint
from torchtitan.config import JobConfig
from torchtitan.loss import LossFn
from torchtitan.models import family_of
from torchtitan.models.llama3 import ModelArgs
from torchtitan.parallel.compose import parallelize
from torchtitan.parallel.dims import ParallelDims
from torchtitan.parallel.pipeline import (
    StagePlan,
    build_pipeline_stage,
    build_schedule,
    build_stage_module,
    head_units,
    microbatch_count,
    plan_stages,
)
from torchtitan.preflight import seed_checkpoint_path

logger = logging.getLogger("torchtitan")


def build_model_parts(
    cfg: JobConfig,
    model_args: ModelArgs,
    dims: ParallelDims,
    device: torch.device,
    step_loss: LossFn,
) -> tuple[list[nn.Module], object, StagePlan | None]:
    """-> (model parts on this rank, pipeline schedule or None, stage plan or None).

    ``step_loss(logits, labels)`` is what the pipeline schedule calls on the last stage.
    """
    start = time.perf_counter()
    family = family_of(cfg.model.name)
    with torch.device("meta"):
        model = family.model_class(model_args)
    schedule, plan = None, None
    if dims.pp > 1:
        parts, schedule, plan = _build_pipeline(model, cfg, model_args, dims, device, step_loss)
    else:
        parts = [parallelize(model, family, dims, cfg, device.type)]
    for part in parts:
        part.to_empty(device=device)
        part.init_weights()
    logger.info(
        "built %s %s: %s, %.2f GFLOPs/token at seq_len %d, %s%s, on %s in %.1fs",
        cfg.model.name,
        cfg.model.flavor,
        _parameter_counts(model_args),
        model_args.flops_per_token(cfg.training.seq_len) / 1e9,
        cfg.training.seq_len,
        dims.describe(),
        f", stages {plan.stage_ids} of {plan.num_stages} ({plan.describe()})" if plan else "",
        device,
        time.perf_counter() - start,
    )
    return parts, schedule, plan


def _parameter_counts(model_args) -> str:
    """``N parameters``; for a MoE model also those a token passes through, which the FLOPs
    (and so TFLOP/s and MFU) count."""
    total = f"{model_args.num_params():,} parameters"
    if getattr(model_args, "moe", None) is None:
        return total
    active = model_args.active_params(include_embedding=True)
    return f"{total}, {active:,} active per token (FLOPs and MFU count these)"


def _build_pipeline(
    model: nn.Module,
    cfg: JobConfig,
    model_args: ModelArgs,
    dims: ParallelDims,
    device: torch.device,
    step_loss: LossFn,
) -> tuple[list[nn.Module], object, StagePlan]:
    p = cfg.parallelism
    pp_mesh = dims.mesh("pp")
    plan = plan_stages(
        model_args.n_layers,
        dims.pp,
        pp_mesh.get_local_rank(),
        p.pipeline_parallel_schedule,
        p.pipeline_parallel_stages_per_rank,
        p.pipeline_parallel_split_points,
        p.pipeline_parallel_layers_per_stage,
        head_units(model_args, cfg.training.seq_len, cfg.activation_checkpoint.mode),
    )
    parts, stages = [], []
    family = family_of(cfg.model.name)
    for stage_id in plan.stage_ids:
        first, last = stage_id == 0, stage_id == plan.num_stages - 1
        part = build_stage_module(
            model,
            plan.layers[stage_id],
            first,
            last,
            family.blocks_attr,
            family.input_modules,
            family.output_modules,
        )
        part = parallelize(part, family, dims, cfg, device.type)
        parts.append(part)
        stages.append(build_pipeline_stage(part, stage_id, plan, device, pp_mesh.get_group()))
    n_microbatches = microbatch_count(
        cfg.training.local_batch_size, p.pipeline_parallel_microbatch_size
    )
    schedule = build_schedule(
        p.pipeline_parallel_schedule,
        stages,
        n_microbatches,
        step_loss,
        p.pipeline_parallel_schedule_csv,
    )
    return parts, schedule, plan


def build_seed_model(model_args: ModelArgs, family_name: str) -> nn.Module:
    """The whole model with its initial weights, on CPU in this one process."""
    with torch.device("meta"):
        model = family_of(family_name).model_class(model_args)
    model.to_empty(device="cpu")
    model.init_weights()
    return model


def write_seed_checkpoint(cfg: JobConfig) -> None:
    """The whole model's initial weights, from one process on CPU (the parity baseline)."""
    job, _ = runtime.start_job(cfg)
    try:
        save_seed_checkpoint(
            build_seed_model(job.model_args, cfg.model.name), seed_checkpoint_path(cfg)
        )
    finally:
        runtime.shutdown_process()
