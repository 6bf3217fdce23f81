"""Checks of everything a user points at, cheap enough to run before any process group or model.

``run_train.sh`` runs ``python -m torchtitan.preflight`` with the same arguments before torchrun,
so a mistake prints one line instead of N tracebacks; the trainer runs the same checks again.
Besides the config, data and tokenizer: the folders the run writes can be created and written,
and the checkpoint folder's disk holds one checkpoint (else an error) and what ``keep_latest_k``
keeps (else a warning, which the trainer logs).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from torchtitan.checkpoint import check_loadable, complete_steps
from torchtitan.checkpoint.hf_load import inspect_hf_checkpoint
from torchtitan.checkpoint.space import (
    SpacePlan,
    checkpoint_bytes,
    existing_ancestor,
    space_warning,
)
from torchtitan.config import ConfigError, JobConfig, parse_args
from torchtitan.data.errors import DataError
from torchtitan.data.loader import resolve_workers
from torchtitan.data.sources import resolve_source
from torchtitan.data.splits import about_validation, validation_dataset
from torchtitan.data.tokenizer import JsonTokenizer, Tokenizer, TokenizerError, load_tokenizer
from torchtitan.fault_tolerance import fault_tolerance_problem, replica_groups
from torchtitan.float8.convert import check_float8
from torchtitan.kernels.inplace_loss import in_place_problem
from torchtitan.models import model_args_from_config
from torchtitan.models.common.attention import attention_problem
from torchtitan.models.llama3 import ModelArgs
from torchtitan.optim import check_optimizer
from torchtitan.parallel.checks import check_parallelism, gradient_accumulation_steps
from torchtitan.parallel.compose import experimental_problem
from torchtitan.parallel.dims import ParallelDims
from torchtitan.paths import absolute, shown
from torchtitan.planning.fit import check_memory

USER_ERRORS = (ConfigError, DataError, TokenizerError)


@dataclass
class CheckedJob:
    tokenizer: Tokenizer | JsonTokenizer
    model_args: ModelArgs
    dims: ParallelDims  # degrees only; the trainer builds the mesh
    accum_steps: int  # micro-steps per optimizer step
    warnings: list[str] = field(default_factory=list)  # the trainer logs them (rank 0)


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
        try:  # the family's own folder check (Llama 3, or Qwen3 dense / MoE)
            inspect_hf_checkpoint(c.initial_load_path, model_args)
        except ValueError as e:
            raise ConfigError(
                f"--checkpoint.initial_load_path {shown(c.initial_load_path)}: {e}"
            ) from None
    elif c.initial_load_path:
        check_loadable(absolute(c.initial_load_path), "--checkpoint.initial_load_path")


def output_folders(cfg: JobConfig) -> list[tuple[str, Path]]:
    """(the option that names it, folder) of every folder the run will write."""
    dump, p = Path(cfg.job.dump_folder).expanduser(), cfg.profiling
    folders = [("--job.dump_folder", dump)]
    if cfg.checkpoint.enable or cfg.checkpoint.create_seed_checkpoint:
        folders.append(("--checkpoint.folder", dump / cfg.checkpoint.folder))
    if cfg.metrics.enable_tensorboard:
        folders.append(("TensorBoard folder (--metrics.enable_tensorboard)", dump / "tb"))
    if p.enable_profiling:
        folders.append(("--profiling.save_traces_folder", dump / p.save_traces_folder))
    if p.enable_memory_snapshot:
        folders.append(
            ("--profiling.save_memory_snapshot_folder", dump / p.save_memory_snapshot_folder)
        )
    return folders


def check_writable(option: str, folder: Path) -> None:
    """``folder`` can be created (if missing) and written: a probe folder and file are made in
    it, or in its nearest existing parent, and removed."""
    base = existing_ancestor(folder)
    if not base.is_dir():
        raise ConfigError(
            f"{option} {shown(folder)}: {base} is a file, not a folder; choose another folder"
        )
    try:
        probe = Path(tempfile.mkdtemp(prefix=".torchtitan-write-check-", dir=base))
        try:
            (probe / "probe").write_bytes(b"0")
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    except OSError as e:
        raise ConfigError(
            f"{option} {shown(folder)} cannot be created or written: creating a folder in "
            f"{base} failed ({e.strerror or e}); choose a folder you can write"
        ) from None


def check_output_folders(cfg: JobConfig) -> None:
    checked: set[Path] = set()
    for option, folder in output_folders(cfg):
        base = existing_ancestor(folder)
        if base not in checked:  # one probe per existing folder
            checked.add(base)
            check_writable(option, folder)


def checkpoint_space_warnings(cfg: JobConfig, model_args: ModelArgs) -> list[str]:
    """A warning when the checkpoint folder's disk cannot hold the checkpoints the run keeps;
    ``CheckpointError`` when it cannot hold one."""
    c = cfg.checkpoint
    folder = Path(cfg.job.dump_folder).expanduser() / c.folder
    params = model_args.num_params()
    if c.create_seed_checkpoint:
        plan = SpacePlan(folder, checkpoint_bytes(params, model_only=True), 0, 1, 1, 0)
    elif c.enable:
        start = c.load_step if c.load_step != -1 else max(complete_steps(folder), default=0)
        steps = (cfg.training.steps, c.interval, c.keep_latest_k)
        plan = SpacePlan(folder, checkpoint_bytes(params), start, *steps)
    else:
        return []
    warning = space_warning(plan)
    return [warning] if warning else []


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


def check_job(cfg: JobConfig, world_size: int) -> CheckedJob:
    cfg.validate()  # parse_args did; a config built in Python has not been checked
    model_args = model_args_from_config(cfg.model, cfg.training.seq_len)
    dims = check_parallelism(cfg, model_args, world_size)
    for reason in (
        in_place_problem(cfg.training.logits_loss, torch.cuda.is_available()),
        experimental_problem(cfg, dims),
        attention_problem(
            model_args.attention,
            cfg.training.seq_len,
            dims.cp,
            torch.cuda.is_available(),
            cfg.training.mixed_precision_param,
        ),
        fault_tolerance_problem(cfg, dims, model_args),
    ):
        if reason:
            raise ConfigError(reason)
    check_float8(cfg.float8)
    check_optimizer(cfg.experimental.compiled_adamw, dims.parameters_distributed)
    check_checkpoint(cfg, model_args, world_size)
    check_output_folders(cfg)
    warnings = checkpoint_space_warnings(cfg, model_args) + schedule_warnings(cfg)
    # Replica groups (fault tolerance) share the global batch like HSDP's replicas.
    accum_steps = gradient_accumulation_steps(cfg, dp_degree=dims.dp_degree * replica_groups(cfg))
    resolve_source(cfg.training.dataset, text_field=cfg.training.text_field)
    check_validation(cfg)
    resolve_workers(cfg.training.data_workers)
    tokenizer = load_tokenizer(cfg.model.tokenizer_path)
    check_vocab_size(cfg, tokenizer, model_args)
    return CheckedJob(tokenizer, model_args, dims, accum_steps, warnings)


def check_vocab_size(
    cfg: JobConfig, tokenizer: Tokenizer | JsonTokenizer, model_args: ModelArgs
) -> None:
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
        spec = validation_dataset(cfg)
        try:
            resolve_source(spec, text_field=cfg.training.text_field)
        except DataError as e:
            raise about_validation(e) from None


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
