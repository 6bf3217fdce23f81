"""Pipeline parallelism: split the meta-device model into stages and pick a schedule.

Stages are copies of the whole model with the other stages' layers deleted (and
``tok_embeddings`` / ``norm`` + ``output`` set to None off the first / last stage), so every stage
keeps the full model's parameter names and then goes through TP -> AC -> compile -> FSDP like the
whole model would. Looped schedules give rank r the stages r, r + pp, r + 2pp, ...; V schedules
(ZBVZeroBubble, DualPipeV) give it r and 2pp - 1 - r.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch.nn as nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    _PipelineScheduleRuntime,
    get_schedule_class,
)

SINGLE_STAGE = ("GPipe", "1F1B")
LOOPED = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
ZERO_BUBBLE = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
SCHEDULES = SINGLE_STAGE + LOOPED + V_SHAPED + ("CSV",)


@dataclass(frozen=True)
class StagePlan:
    """Which stages this rank runs and which units (embedding, layers, head) each stage holds."""

    num_stages: int
    stage_ids: tuple[int, ...]  # this rank's stages, in execution order
    layers: tuple[tuple[int, ...], ...]  # layer indices of every stage (all stages)

    def has_first(self) -> bool:
        return 0 in self.stage_ids

    def has_last(self) -> bool:
        return self.num_stages - 1 in self.stage_ids


def stages_per_rank(schedule: str, requested: int) -> int:
    if schedule in SINGLE_STAGE:
        return 1
    if schedule in V_SHAPED:
        return 2
    return requested or 2


def stage_ids_for_rank(schedule: str, pp_rank: int, pp: int, per_rank: int) -> tuple[int, ...]:
    if schedule in V_SHAPED:
        return (pp_rank, 2 * pp - 1 - pp_rank)
    return tuple(pp_rank + i * pp for i in range(per_rank))


def balanced_split(n_layers: int, num_stages: int) -> tuple[tuple[int, ...], ...]:
    """Contiguous layers per stage, counting the embedding and the output head as one layer
    each (first and last stage), so all stages get about the same number of units."""
    units = n_layers + 2
    if num_stages > units:
        raise ValueError(
            f"{num_stages} pipeline stages but only {n_layers} layers (+ embedding and head); "
            "use fewer stages (pipeline_parallel_degree x stages per rank)"
        )
    base, extra = divmod(units, num_stages)
    sizes = [base + (1 if s < extra else 0) for s in range(num_stages)]
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    # unit u is layer u - 1; unit 0 is the embedding and unit n_layers + 1 the head
    return tuple(
        tuple(u - 1 for u in range(lo, hi) if 1 <= u <= n_layers)
        for lo, hi in zip(bounds, bounds[1:])
    )


def split_at(n_layers: int, split_points: list[int]) -> tuple[tuple[int, ...], ...]:
    """Stages starting at the given layer indices (the first stage starts at 0)."""
    starts = [0, *split_points]
    if starts != sorted(set(starts)) or starts[-1] >= n_layers or starts[1:2] == [0]:
        raise ValueError(
            f"pipeline_parallel_split_points {split_points} must be increasing layer indices "
            f"in 1..{n_layers - 1}"
        )
    ends = [*split_points, n_layers]
    return tuple(tuple(range(lo, hi)) for lo, hi in zip(starts, ends))


def plan_stages(
    n_layers: int,
    pp: int,
    pp_rank: int,
    schedule: str,
    requested_per_rank: int = 0,
    split_points: list[int] | None = None,
    layers_per_stage: int = 0,
) -> StagePlan:
    """Raises ValueError (one line) for splits that cannot work."""
    per_rank = stages_per_rank(schedule, requested_per_rank)
    if layers_per_stage:
        if n_layers % layers_per_stage:
            raise ValueError(
                f"pipeline_parallel_layers_per_stage={layers_per_stage} does not divide "
                f"n_layers={n_layers}"
            )
        num_stages = n_layers // layers_per_stage
        if num_stages % pp:
            raise ValueError(
                f"{num_stages} stages of {layers_per_stage} layers cannot be spread evenly over "
                f"pipeline_parallel_degree={pp}"
            )
        if schedule in SINGLE_STAGE and num_stages != pp:
            raise ValueError(
                f"{schedule} runs one stage per rank but {layers_per_stage} layers per stage "
                f"makes {num_stages} stages for pipeline_parallel_degree={pp}"
            )
        per_rank = num_stages // pp
        layers = tuple(
            tuple(range(s * layers_per_stage, (s + 1) * layers_per_stage))
            for s in range(num_stages)
        )
    elif split_points:
        layers = split_at(n_layers, split_points)
        num_stages = len(layers)
        if num_stages != pp * per_rank:
            raise ValueError(
                f"{len(split_points)} split points make {num_stages} stages but {schedule} with "
                f"pipeline_parallel_degree={pp} needs {pp * per_rank}"
            )
    else:
        num_stages = pp * per_rank
        layers = balanced_split(n_layers, num_stages)
    if schedule in V_SHAPED and per_rank != 2:
        raise ValueError(f"{schedule} needs exactly 2 stages per rank; got {per_rank}")
    return StagePlan(num_stages, stage_ids_for_rank(schedule, pp_rank, pp, per_rank), layers)


def check_microbatches(schedule: str, n_microbatches: int, pp: int, num_stages: int) -> None:
    """The schedules' own requirements, checked before any model is built."""
    if schedule == "1F1B" and n_microbatches < pp:
        raise ValueError(
            f"1F1B needs at least {pp} microbatches (one per stage); got {n_microbatches}"
        )
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, n_microbatches // pp)
        if n_microbatches % rounds:
            raise ValueError(
                f"{schedule} needs the microbatch count ({n_microbatches}) to be a multiple of "
                f"{rounds} (microbatches // pipeline_parallel_degree)"
            )
    if schedule in V_SHAPED and n_microbatches < num_stages:
        raise ValueError(
            f"{schedule} needs at least {num_stages} microbatches (one per stage); "
            f"got {n_microbatches}"
        )


def build_stage_module(model: nn.Module, layers: tuple[int, ...], first: bool, last: bool):
    """A copy of the (meta) model holding only ``layers``, the embedding iff first, and the final
    norm and head iff last."""
    stage = copy.deepcopy(model)
    keep = {str(i) for i in layers}
    for name in list(stage.layers.keys()):
        if name not in keep:
            del stage.layers[name]
    if not first:
        stage.tok_embeddings = None
    if not last:
        stage.norm = None
        stage.output = None
    return stage


def build_pipeline_stage(module: nn.Module, stage_id: int, plan: StagePlan, device, group):
    return PipelineStage(module, stage_id, plan.num_stages, device, group=group)


def build_schedule(
    schedule: str,
    stages: list[PipelineStage],
    n_microbatches: int,
    loss_fn,
    csv_path: str = "",
):
    """A schedule object; loss_fn returns the microbatch's share of the step's mean loss, so
    gradients are not scaled again (scale_grads=False)."""
    if schedule == "CSV":
        runtime = _PipelineScheduleRuntime(
            stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False
        )
        runtime._load_csv(csv_path)
        return runtime
    cls = get_schedule_class(schedule)
    if issubclass(cls, PipelineScheduleMulti):
        return cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)
    (stage,) = stages
    return cls(stage, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)


def microbatch_count(local_batch_size: int, microbatch_size: int) -> int:
    if local_batch_size % microbatch_size:
        raise ValueError(
            f"training.local_batch_size={local_batch_size} is not divisible by "
            f"pipeline_parallel_microbatch_size={microbatch_size}"
        )
    return local_batch_size // microbatch_size
