"""What a pipeline schedule means for one rank: which units it holds, how many microbatch
chunks it keeps alive at its memory peak, and the share of the step lost to the bubble.

The stage split is the trainer's own (``plan_stages``); the in-flight counts follow the warm-up
lengths of torch.distributed.pipelining's schedules.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from torchtitan.parallel.pipeline import (
    LOOPED,
    SINGLE_STAGE,
    V_SHAPED,
    ZERO_BUBBLE,
    head_units,
    plan_stages,
)
from torchtitan.planning.layout import Layout, Workload


@dataclass(frozen=True)
class RankStages:
    """The units one pipeline rank holds (all of them when pp == 1)."""

    pp_rank: int
    layers: tuple[int, ...]  # per stage of this rank: its number of transformer blocks
    embedding: bool
    head: bool

    @property
    def n_blocks(self) -> int:
        return sum(self.layers)

    @property
    def n_stages(self) -> int:
        return len(self.layers)


def _schedule_for_split(schedule: str) -> str:
    return "Interleaved1F1B" if schedule == "CSV" else schedule


def rank_stages(work: Workload, layout: Layout) -> tuple[RankStages, ...]:
    """Every pipeline rank's stages (one entry when pp == 1)."""
    n_layers = work.model.n_layers
    if layout.pp == 1:
        return (RankStages(0, (n_layers,), True, True),)
    return _pipeline_ranks(
        n_layers,
        layout.pp,
        _schedule_for_split(layout.pp_schedule),
        layout.pp_stages_per_rank,
        layout.pp_split_points,
        layout.pp_layers_per_stage,
        head_units(work.model, work.seq_len, layout.ac_mode),
    )


@functools.lru_cache(maxsize=1024)
def _pipeline_ranks(n_layers, pp, schedule, per_rank, split_points, layers_per_stage, head):
    ranks = []
    for r in range(pp):
        plan = plan_stages(
            n_layers, pp, r, schedule, per_rank, list(split_points), layers_per_stage, head
        )
        layers = tuple(len(plan.layers[s]) for s in plan.stage_ids)
        ranks.append(RankStages(r, layers, plan.has_first(), plan.has_last()))
    return tuple(ranks)


def inflight_chunks(layout: Layout, pp_rank: int, n_stages_local: int) -> int:
    """Microbatch x local-stage forwards whose activations rank ``pp_rank`` holds at its peak
    (1 without PP: the one microbatch of the step)."""
    if layout.pp == 1:
        return 1
    schedule = _schedule_for_split(layout.pp_schedule)
    n_mb, pp, v = layout.n_microbatches, layout.pp, n_stages_local
    total = n_mb * v
    if schedule == "GPipe" or schedule == "LoopedBFS":
        return total  # every forward runs before the first backward
    if schedule in SINGLE_STAGE:  # 1F1B
        return min(total, pp - pp_rank)
    if schedule in V_SHAPED:
        return min(total, 2 * (pp - pp_rank))
    # Interleaved1F1B / InterleavedZeroBubble (warm-up of torch's _get_warmup_ops, + the 1F)
    rounds = max(1, n_mb // pp)
    per_round = n_mb // rounds
    factor = 1 if schedule == "InterleavedZeroBubble" else 2
    warmup = (v - 1) * per_round + factor * (pp - 1 - pp_rank)
    return min(total, warmup + 1)


def bubble_fraction(layout: Layout, n_stages_local: int) -> float:
    """Idle share of a pipelined step: (pp - 1) / (microbatches x stages per rank + pp - 1) for
    the 1F1B family; zero-bubble schedules fill most of it with weight-gradient work."""
    if layout.pp == 1:
        return 0.0
    schedule = _schedule_for_split(layout.pp_schedule)
    n = layout.n_microbatches * (n_stages_local if schedule in LOOPED + V_SHAPED else 1)
    bubble = (layout.pp - 1) / (n + layout.pp - 1)
    if schedule in V_SHAPED:
        return bubble * 0.15  # ZBV / DualPipeV: near zero when microbatches >= 2 x pp
    if schedule in ZERO_BUBBLE:
        return bubble / 3  # ZB-H1: a third of 1F1B's bubble
    return bubble
