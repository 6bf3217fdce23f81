"""Checks of everything a user points at, cheap enough to run before any process group or model.

``run_train.sh`` runs ``python -m torchtitan.preflight`` with the same arguments before torchrun,
so a mistake prints one line instead of N tracebacks; the trainer runs the same checks again.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from torchtitan.checkpoint import check_loadable
from torchtitan.config import ConfigError, JobConfig, parse_args
from torchtitan.data.errors import DataError
from torchtitan.data.loader import resolve_workers
from torchtitan.data.sources import resolve_source
from torchtitan.data.splits import validation_dataset
from torchtitan.data.tokenizer import Tokenizer, TokenizerError
from torchtitan.inplace_loss import in_place_problem
from torchtitan.models.llama3 import ModelArgs, model_args_for_job
from torchtitan.models.llama3.hf import inspect_hf_checkpoint
from torchtitan.optim import check_optimizer
from torchtitan.parallel.context_parallel import check_cp
from torchtitan.parallel.copy_engine_all_gather import copy_engine_problem, local_gpus
from torchtitan.parallel.dims import ParallelDims
from torchtitan.parallel.float8 import check_float8
from torchtitan.parallel.pipeline import (
    ZERO_BUBBLE,
    check_microbatches,
    head_units,
    microbatch_count,
    plan_stages,
)
from torchtitan.parallel.tensor_parallel import check_tp_degree
from torchtitan.paths import absolute, shown
from torchtitan.planning.fit import check_memory

USER_ERRORS = (ConfigError, DataError, TokenizerError)


@dataclass
class CheckedJob:
    tokenizer: Tokenizer
    model_args: ModelArgs
    dims: ParallelDims  # degrees only; the trainer builds the mesh
    accum_steps: int  # micro-steps per optimizer step
    warnings: list[str] = field(default_factory=list)  # the trainer logs them (rank 0)


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
    if cfg.parallelism.fsdp_all_gather == "copy_engines":
        reason = copy_engine_problem(dims.fsdp_degree, dims.tp, local_gpus(), dims.pp)
        if reason:
            raise ConfigError(reason)
    reason = in_place_problem(cfg.training.logits_loss, torch.cuda.is_available())
    if reason:
        raise ConfigError(reason)
    if cfg.parallelism.enable_async_tensor_parallel:
        if dims.tp == 1 or not cfg.compile.enable or not torch.cuda.is_available():
            raise ConfigError(
                "--parallelism.enable_async_tensor_parallel needs tensor_parallel_degree > 1, "
                "--compile.enable and CUDA GPUs"
            )
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


def check_checkpoint(cfg: JobConfig, model_args: ModelArgs, world_size: int) -> None:
    c = cfg.checkpoint
    if c.create_seed_checkpoint:
        if world_size != 1:
            raise ConfigError("--checkpoint.create_seed_checkpoint runs in one process; use NGPU=1")
        seed = seed_checkpoint_path(cfg)
        if seed.exists():
            raise ConfigError(
                f"seed checkpoint {shown(seed)} already exists; remove it or change the folder"
            )
    if c.initial_load_in_hf and not c.initial_load_path:
        raise ConfigError("--checkpoint.initial_load_in_hf needs --checkpoint.initial_load_path")
    if c.initial_load_path and c.initial_load_in_hf:
        try:
            inspect_hf_checkpoint(c.initial_load_path, model_args)
        except ValueError as e:
            raise ConfigError(
                f"--checkpoint.initial_load_path {shown(c.initial_load_path)}: {e}"
            ) from None
    elif c.initial_load_path:
        check_loadable(absolute(c.initial_load_path), "--checkpoint.initial_load_path")


def schedule_warnings(cfg: JobConfig) -> list[str]:
    """Settings that run but are likely not what the user meant."""
    warmup, steps = cfg.lr_scheduler.warmup_steps, cfg.training.steps
    if warmup > steps:
        return [
            f"lr_scheduler.warmup_steps={warmup} is longer than training.steps={steps}: the lr "
            f"never reaches its peak (it ends at {steps / warmup:.0%} of --optimizer.lr)"
        ]
    return []


def seed_checkpoint_path(cfg: JobConfig) -> Path:
    return Path(cfg.job.dump_folder) / cfg.checkpoint.folder / "step-0"


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


def check_job(cfg: JobConfig, world_size: int) -> CheckedJob:
    cfg.validate()  # parse_args did; a config built in Python has not been checked
    model_args = model_args_for_job(cfg)
    dims = check_parallelism(cfg, model_args, world_size)
    check_float8(cfg.float8)
    check_optimizer(cfg.optimizer, dims.parameters_distributed)
    check_checkpoint(cfg, model_args, world_size)
    accum_steps = gradient_accumulation_steps(cfg, dp_degree=dims.dp_degree)
    resolve_source(cfg.training.dataset, text_field=cfg.training.text_field)
    check_validation(cfg)
    resolve_workers(cfg.training.data_workers)
    tokenizer = Tokenizer(cfg.model.tokenizer_path)
    check_vocab_size(cfg, tokenizer, model_args)
    return CheckedJob(tokenizer, model_args, dims, accum_steps, schedule_warnings(cfg))


def check_vocab_size(cfg: JobConfig, tokenizer: Tokenizer, model_args: ModelArgs) -> None:
    """Every token id the tokenizer emits needs a row in the embedding and the head."""
    if tokenizer.vocab_size <= model_args.vocab_size:
        return
    model = (
        f"--model.vocab_size is {model_args.vocab_size}"
        if cfg.model.vocab_size
        else f"model flavor {cfg.model.flavor} has vocab_size {model_args.vocab_size}"
    )
    raise ConfigError(
        f"tokenizer {cfg.model.tokenizer_path} has {tokenizer.vocab_size} tokens but {model}; "
        f"set --model.vocab_size to at least {tokenizer.vocab_size} or use a matching "
        "--model.tokenizer_path"
    )


def check_validation(cfg: JobConfig) -> None:
    """The validation data exists (its size is checked by the trainer, which reads it)."""
    if cfg.validation.enable:
        resolve_source(validation_dataset(cfg), text_field=cfg.training.text_field)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg, world_size = parse_args(argv), int(os.environ.get("WORLD_SIZE", "1"))
        check_job(cfg, world_size)
        check_memory(cfg, world_size)  # CUDA only: the planner's estimate against the GPU
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
