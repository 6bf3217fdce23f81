"""Checks of the parallelism settings against the model and the world size, before any process
group or model exists (preflight, the trainer and the planner share them)."""

from __future__ import annotations

from pathlib import Path

import torch

from torchtitan.config import ConfigError, JobConfig
from torchtitan.models import family_of
from torchtitan.models.llama3 import ModelArgs
from torchtitan.parallel.context_parallel import check_cp
from torchtitan.parallel.dims import ParallelDims
from torchtitan.parallel.expert_parallel import check_expert_parallel
from torchtitan.parallel.pipeline import (
    ZERO_BUBBLE,
    check_microbatches,
    head_units,
    microbatch_count,
    plan_stages,
)
from torchtitan.parallel.tensor_parallel import check_tp_degree
from torchtitan.paths import shown


def check_parallelism(cfg: JobConfig, model_args: ModelArgs, world_size: int) -> ParallelDims:
    dims = ParallelDims.from_config(cfg.parallelism, world_size)
    if dims.cp > 1:
        reason = check_cp(cfg.training.seq_len, dims.cp)
        if reason:
            raise ConfigError(f"{reason}; change --training.seq_len or the context parallel degree")
        if cfg.parallelism.context_parallel_rotate_method == "alltoall" and cfg.compile.enable:
            # Measured: gloo's timeout in step 1 on CPU (torch 2.13, with or without AC), and no
            # first step within 116 s on 4x H200 (torch 2.11); docs/parallelism.md.
            raise ConfigError(
                "--parallelism.context_parallel_rotate_method alltoall hangs with "
                "--compile.enable; use allgather (the default) or drop --compile.enable"
            )
    if dims.pp > 1:
        check_pipeline(cfg, model_args, dims)
    if dims.tp > 1:
        reason = check_tp_degree(
            model_args.n_heads, model_args.kv_heads, cfg.training.seq_len, dims.tp
        )
        if reason:
            raise ConfigError(f"{reason}; choose another --parallelism.tensor_parallel_degree")
    if cfg.parallelism.enable_async_tensor_parallel:
        if dims.tp == 1 or not cfg.compile.enable or not torch.cuda.is_available():
            raise ConfigError(
                "--parallelism.enable_async_tensor_parallel needs tensor_parallel_degree > 1, "
                "--compile.enable and CUDA GPUs"
            )
    moe = getattr(model_args, "moe", None)
    reason = check_expert_parallel(moe.num_experts if moe else None, dims.ep)
    reason = reason or family_of(cfg.model.name).unsupported(model_args, dims)
    if reason:
        raise ConfigError(reason)
    return dims


def check_pipeline(cfg: JobConfig, model_args: ModelArgs, dims: ParallelDims) -> None:
    p = cfg.parallelism
    schedule = p.pipeline_parallel_schedule
    if schedule == "CSV" and not Path(p.pipeline_parallel_schedule_csv).is_file():
        raise ConfigError(
            "schedule CSV needs --parallelism.pipeline_parallel_schedule_csv pointing at a file; "
            f"got {shown(p.pipeline_parallel_schedule_csv)}"
        )
    if schedule in ZERO_BUBBLE and cfg.compile.enable:
        raise ConfigError(
            f"{schedule} splits backward into input and weight gradients, which torch does not "
            "support for compiled stages; use another schedule or drop --compile.enable"
        )
    try:
        n_microbatches = microbatch_count(
            cfg.training.local_batch_size, p.pipeline_parallel_microbatch_size
        )
        plan = plan_stages(
            model_args.n_layers,
            dims.pp,
            0,
            schedule if schedule != "CSV" else "Interleaved1F1B",
            p.pipeline_parallel_stages_per_rank,
            p.pipeline_parallel_split_points,
            p.pipeline_parallel_layers_per_stage,
            head_units(model_args, cfg.training.seq_len, cfg.activation_checkpoint.mode),
        )
        check_microbatches(schedule, n_microbatches, dims.pp, plan.num_stages)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def gradient_accumulation_steps(cfg: JobConfig, dp_degree: int) -> int:
    t = cfg.training
    per_micro_step = t.local_batch_size * dp_degree
    global_batch = per_micro_step if t.global_batch_size == -1 else t.global_batch_size
    if global_batch % per_micro_step:
        raise ConfigError(
            f"--training.global_batch_size {global_batch} must be a multiple of "
            f"local_batch_size x data-parallel degree = {per_micro_step}"
        )
    return global_batch // per_micro_step
