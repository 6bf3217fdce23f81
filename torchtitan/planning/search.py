"""Enumerate every layout of a job on some hardware, drop the ones the trainer would refuse or
that do not fit, and rank the rest by estimated tokens/s per GPU.

Validity is decided by the trainer's own checks (torchtitan.parallel.checks.check_parallelism
and gradient_accumulation_steps), so the planner never proposes a layout the trainer refuses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from torchtitan.config import ConfigError, JobConfig, PipelineSchedule, choices
from torchtitan.parallel.checks import check_parallelism, gradient_accumulation_steps
from torchtitan.planning import calibration as cal
from torchtitan.planning.command import planned_config
from torchtitan.planning.hardware import GIB, Hardware
from torchtitan.planning.layout import Layout, Workload
from torchtitan.planning.memory import MemoryEstimate, estimate_memory
from torchtitan.planning.timing import TimeEstimate, estimate_time

# (mode, selective_ac_option, save_matmuls): from most memory to least.
AC_CHOICES = (
    ("none", "op", "all"),
    ("selective", "op", "all"),
    ("selective", "op", "alternate"),
    ("selective", "2", "all"),
    ("full", "op", "all"),
)
PP_SCHEDULES = tuple(s for s in choices(PipelineSchedule) if s != "CSV")


@dataclass
class Candidate:
    layout: Layout
    memory: MemoryEstimate | None = None
    time: TimeEstimate | None = None
    reason: str = ""  # why it was rejected; empty if it fits

    @property
    def tokens_per_second(self) -> float:
        return self.time.tokens_per_second_per_gpu if self.time else 0.0


@dataclass
class Plan:
    hardware: Hardware
    workload: Workload  # its global_batch_size is fixed: every layout keeps it
    fits: list[Candidate] = field(default_factory=list)  # best first
    rejected: list[Candidate] = field(default_factory=list)

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, kept by every layout."""
        return self.workload.global_batch_size


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def degree_tuples(world: int) -> list[tuple[int, int, int, int, int]]:
    """(pp, dp_replicate, dp_shard, cp, tp) whose product is the world size."""
    out = []
    for pp in _divisors(world):
        for tp in _divisors(world // pp):
            for cp in _divisors(world // pp // tp):
                rest = world // pp // tp // cp
                for rep in _divisors(rest):
                    out.append((pp, rep, rest // rep, cp, tp))
    return out


def expert_degrees(experts: int, token_ranks: int) -> list[int]:
    """Expert parallel degrees to try: divisors of the experts per MoE layer that divide the
    ranks EP borrows (dp_shard x cp x tp); only 1 for a dense model (experts 0)."""
    return [ep for ep in _divisors(token_ranks) if experts % ep == 0] if experts else [1]


def _structures(world: int, global_batch: int, experts: int = 0):
    """Layouts without AC choices: degrees (and EP for MoE) x local batch x pipeline
    schedule/microbatch."""
    for pp, rep, shard, cp, tp in degree_tuples(world):
        dp = rep * shard
        per_rank = global_batch // dp if global_batch % dp == 0 else 0
        locals_ = _divisors(per_rank) if per_rank else [max(1, global_batch // dp)]
        for ep in expert_degrees(experts, shard * cp * tp):
            for local in locals_:
                base = Layout(rep, shard, cp, tp, pp, local_batch_size=local, ep=ep)
                if pp == 1:
                    yield base
                    continue
                for schedule in PP_SCHEDULES:
                    for mb in _divisors(local):
                        yield dataclasses.replace(base, pp_schedule=schedule, pp_microbatch_size=mb)


def check_job(job: JobConfig, layout: Layout, world: int, model_args) -> str:
    """The trainer's reason to refuse ``job`` (which runs ``layout``), or "" if it accepts it.
    Async TP is left out: it needs a GPU where the planner runs, and the model ignores it."""
    p = dataclasses.replace(job.parallelism, enable_async_tensor_parallel=False)
    try:
        check_parallelism(dataclasses.replace(job, parallelism=p), model_args, world)
        gradient_accumulation_steps(job, layout.dp_degree)
    except ConfigError as e:
        return str(e)
    return ""


def usable_bytes(hw: Hardware) -> float:
    return hw.memory_bytes - cal.NON_ALLOCATOR_BYTES


def evaluate(work: Workload, layout: Layout, hw: Hardware) -> Candidate:
    memory = estimate_memory(work, layout)
    candidate = Candidate(layout, memory, estimate_time(work, layout, hw))
    if memory.total > usable_bytes(hw):
        name, part = memory.largest(1)[0]
        candidate.reason = (
            f"needs {memory.total_gib:.1f} GiB of {usable_bytes(hw) / GIB:.1f} GiB usable "
            f"(largest: {name} {part / GIB:.1f} GiB)"
        )
    return candidate


def search(cfg: JobConfig, work: Workload, hw: Hardware) -> Plan:
    """Every valid layout of ``cfg`` on ``hw``: those that fit ranked by tokens/s per GPU."""
    world = hw.world_size
    # Every layout keeps the configured global batch, or what the config's own layout runs.
    global_batch = work.global_samples(Layout.from_config(cfg, world))
    plan = Plan(hw, work.with_(global_batch_size=global_batch))
    for structure in _structures(world, global_batch, work.shape.experts):
        job = planned_config(cfg, structure, global_batch)
        reason = check_job(job, structure, world, work.model)
        if reason:  # whatever the activation checkpointing
            plan.rejected.append(Candidate(structure, reason=reason))
            continue
        for mode, option, save in AC_CHOICES:
            layout = dataclasses.replace(
                structure, ac_mode=mode, ac_option=option, save_matmuls=save
            )
            candidate = evaluate(plan.workload, layout, hw)
            (plan.rejected if candidate.reason else plan.fits).append(candidate)
    plan.fits.sort(key=lambda c: (-c.tokens_per_second, c.memory.total))
    return plan
