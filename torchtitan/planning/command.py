"""The ``run_train.sh`` command line that runs a planned job: every option that differs from what
the config file alone gives, as ``--section.key value`` overrides the trainer parses back."""

from __future__ import annotations

import dataclasses
import functools
import shlex

from torchtitan.config import JobConfig, parse_args
from torchtitan.planning.hardware import Hardware
from torchtitan.planning.layout import Layout


def planned_config(cfg: JobConfig, layout: Layout, global_batch: int) -> JobConfig:
    """``cfg`` running ``layout`` with ``global_batch`` samples per step, and with
    ``compile.enable`` and ``compile.loss`` on (the estimates are calibrated with compiled blocks
    and loss). data_parallel_shard_degree -1 and global_batch_size -1 stay where they mean the
    same; async TP stays on only with TP."""
    job = layout.apply_to(cfg)
    p, t = job.parallelism, job.training
    no_accumulation = global_batch == layout.local_batch_size * layout.dp_degree
    return dataclasses.replace(
        job,
        compile=dataclasses.replace(job.compile, enable=True, loss=True),
        training=dataclasses.replace(
            t,
            global_batch_size=(
                -1 if cfg.training.global_batch_size == -1 and no_accumulation else global_batch
            ),
        ),
        parallelism=dataclasses.replace(
            p,
            data_parallel_shard_degree=(
                -1 if cfg.parallelism.data_parallel_shard_degree == -1 else layout.dp_shard
            ),
            enable_async_tensor_parallel=p.enable_async_tensor_parallel and layout.tp > 1,
            pipeline_parallel_schedule=(
                layout.pp_schedule if layout.pp > 1 else p.pipeline_parallel_schedule
            ),
        ),
    )


def _cli_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def overrides(job: JobConfig, config_file: str) -> list[str]:
    """``--section.key value`` for every option of ``job`` the config file does not set so."""
    return diff_args(job, _file_config(config_file))


def diff_args(job: JobConfig, base: JobConfig) -> list[str]:
    """``--section.key value`` for every option where ``job`` differs from ``base``."""
    args: list[str] = []
    for section in dataclasses.fields(job):
        ours, theirs = getattr(job, section.name), getattr(base, section.name)
        for f in dataclasses.fields(ours):
            value = getattr(ours, f.name)
            if value == getattr(theirs, f.name) or f.name == "config_file":
                continue
            key = f"--{section.name}.{f.name}"
            text = _cli_value(value)
            if value is True:
                args.append(key)
            elif text == "":
                args.append(f"{key}=")
            else:
                args += [key, text]
    return args


@functools.lru_cache(maxsize=8)
def _file_config(config_file: str) -> JobConfig:
    """What the config file alone gives (cached: the search asks per printed layout)."""
    return parse_args(["--job.config_file", config_file] if config_file else [])


def run_train_command(job: JobConfig, config_file: str, hw: Hardware) -> str:
    env = [f"NGPU={hw.gpus_per_node}"]
    if hw.nodes > 1:
        env.append(f"NNODES={hw.nodes}")
    if config_file:
        env.append(f"CONFIG_FILE={shlex.quote(config_file)}")
    args = " ".join(shlex.quote(a) for a in overrides(job, config_file))
    return " ".join(env) + " ./run_train.sh" + (f" {args}" if args else "")
