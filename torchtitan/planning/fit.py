"""The memory check preflight runs before a CUDA launch: print the job's estimated per-GPU peak
and stop, in one line, when it clearly exceeds the GPU's memory, naming the largest part and a
change that fits (the planner's best layout)."""

from __future__ import annotations

import shlex

import torch

from torchtitan.config import ConfigError, JobConfig
from torchtitan.planning.command import diff_args, planned_config
from torchtitan.planning.hardware import CARDS, GIB, Hardware, card_for_device_name, make_hardware
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.memory import MemoryEstimate, estimate_memory
from torchtitan.planning.search import search

STOP_RATIO = 1.1  # stop when the estimate exceeds the GPU's memory by more than this


def local_hardware(world_size: int) -> Hardware:
    """This machine's GPU 0 (its real memory; speed from the card table) x the launch's world."""
    props = torch.cuda.get_device_properties(0)
    per_node = max(1, min(world_size, torch.cuda.device_count()))
    card = card_for_device_name(props.name) or CARDS["H100"]
    return make_hardware(
        per_node,
        max(1, world_size // per_node),
        card.name,
        memory_gib=props.total_memory / GIB,
    )


def job_estimate(cfg: JobConfig, world_size: int) -> MemoryEstimate:
    layout = Layout.from_config(cfg, world_size)
    return estimate_memory(Workload.from_config(cfg), layout)


def suggestion(cfg: JobConfig, hw: Hardware) -> str:
    """The overrides that turn ``cfg`` into the planner's best layout that fits."""
    work = Workload.from_config(cfg).with_(compile=True, compile_loss=True)
    plan = search(cfg, work, hw)
    if not plan.fits:
        return "; no layout of this job fits these GPUs (python -m torchtitan.plan --explain)"
    best = plan.fits[0]
    args = diff_args(planned_config(cfg, best.layout, plan.global_batch), cfg)
    return (
        f"; {' '.join(shlex.quote(a) for a in args)} fits "
        f"(~{best.memory.total_gib:.0f} GiB; python -m torchtitan.plan lists more)"
    )


def check_memory(cfg: JobConfig, world_size: int) -> None:
    """On CUDA: print the estimate; raise ConfigError when it exceeds STOP_RATIO x the memory."""
    if not torch.cuda.is_available():
        return
    hw = local_hardware(world_size)
    estimate = job_estimate(cfg, world_size)
    print(f"memory plan: ~{estimate.describe()} per GPU of {hw.card.memory_gib:.1f} GiB")
    if cfg.job.skip_memory_check or estimate.total <= STOP_RATIO * hw.memory_bytes:
        return
    name, part = estimate.largest(1)[0]
    raise ConfigError(
        f"the job needs ~{estimate.total_gib:.0f} GiB per GPU but the GPU has "
        f"{hw.card.memory_gib:.0f} GiB (largest: {name} {part / GIB:.0f} GiB)"
        f"{suggestion(cfg, hw)}; --job.skip_memory_check launches anyway"
    )
