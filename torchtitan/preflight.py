"""Checks of everything a user points at, cheap enough to run before any process group or model.

``run_train.sh`` runs ``python -m torchtitan.preflight`` with the same arguments before torchrun,
so a mistake prints one line instead of N tracebacks; the trainer runs the same checks again.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from torchtitan.config import ConfigError, JobConfig, parse_args
from torchtitan.data.text import DataError, resolve_source
from torchtitan.data.tokenizer import Tokenizer, TokenizerError
from torchtitan.models.llama3 import ModelArgs, get_model_args

USER_ERRORS = (ConfigError, DataError, TokenizerError)


@dataclass
class CheckedJob:
    tokenizer: Tokenizer
    model_args: ModelArgs
    accum_steps: int  # micro-steps per optimizer step


def check_layout(cfg: JobConfig, world_size: int) -> None:
    p = cfg.parallelism
    degrees = {
        "pipeline_parallel_degree": p.pipeline_parallel_degree,
        "data_parallel_replicate_degree": p.data_parallel_replicate_degree,
        "context_parallel_degree": p.context_parallel_degree,
        "tensor_parallel_degree": p.tensor_parallel_degree,
    }
    others = [f"{k}={v}" for k, v in degrees.items() if v != 1]
    if others:
        raise ConfigError(
            f"{', '.join(others)}: only data parallel is supported so far; set them to 1"
        )
    if p.data_parallel_shard_degree not in (-1, world_size):
        raise ConfigError(
            f"data_parallel_shard_degree={p.data_parallel_shard_degree} does not match the "
            f"world size {world_size}; set it to -1 or {world_size}"
        )
    if world_size > 1:
        raise ConfigError("multi-process training needs the parallelism work; launch with NGPU=1")


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
    check_layout(cfg, world_size)
    try:
        model_args = get_model_args(cfg.model.flavor, max_seq_len=cfg.training.seq_len)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    accum_steps = gradient_accumulation_steps(cfg, dp_degree=world_size)
    resolve_source(cfg.training.dataset, text_field=cfg.training.text_field)
    tokenizer = Tokenizer(cfg.model.tokenizer_path)
    if tokenizer.vocab_size > model_args.vocab_size:
        raise ConfigError(
            f"tokenizer {cfg.model.tokenizer_path} has {tokenizer.vocab_size} tokens but model "
            f"flavor {cfg.model.flavor} has vocab_size {model_args.vocab_size}; use a matching "
            "--model.tokenizer_path or a larger flavor"
        )
    return CheckedJob(tokenizer, model_args, accum_steps)


def main(argv: list[str] | None = None) -> int:
    try:
        check_job(parse_args(argv), world_size=int(os.environ.get("WORLD_SIZE", "1")))
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
