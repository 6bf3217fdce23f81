"""Pipeline parallelism: split the meta-device model into stages and pick a schedule.

Stages are copies of the whole model without the other stages' blocks (and with the input modules
/ the norm + head set to None off the first / last stage), so every stage keeps the full model's
parameter names and then goes through TP -> AC -> compile -> FSDP like the whole model would.
The names default to Llama's (``llama.py``); a custom model passes its own. Looped schedules give
rank r the stages r, r + pp, r + 2pp, ...; V schedules (ZBVZeroBubble, DualPipeV) give it r and
2pp - 1 - r.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch.nn as nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    _PipelineScheduleRuntime,
    get_schedule_class,
)

from torchtitan.parallel.blocks import BlockOnAnotherStage, block_items

SINGLE_STAGE = ("GPipe", "1F1B")
LOOPED = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
ZERO_BUBBLE = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


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

    def describe(self) -> str:
        """Layers per stage, e.g. ``layers 8|9|9|6 + head``."""
        return "layers " + "|".join(str(len(stage)) for stage in self.layers) + " + head"


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


def rank_of_stage(schedule: str, stage: int, pp: int) -> int:
    if schedule in V_SHAPED:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def head_units(model_args, seq_len: int, ac_mode: str = "none") -> float:
    """The output head's training work in blocks, for a model whose args give
    ``head_flops_per_token()`` and ``block_flops_per_token(seq_len)`` (Llama's do): the FLOPs
    ratio, the block grown by the forward that full activation checkpointing runs again
    (selective AC recomputes little and is not counted)."""
    block = model_args.block_flops_per_token(seq_len) * (4 / 3 if ac_mode == "full" else 1.0)
    return model_args.head_flops_per_token() / block


def balanced_split(
    n_layers: int,
    num_stages: int,
    head: float = 1.0,
    embedding: float = 0.0,
    ranks: Sequence[int] | None = None,
) -> tuple[tuple[int, ...], ...]:
    """Contiguous layers per stage such that every rank's stages together, then every stage,
    carry about the same work, counting a block as 1, the embedding (first stage) as
    ``embedding`` and the output head (last stage) as ``head`` (see ``head_units``: about 2 for
    Llama 3 8B at seq 8192, 3.4 for 1B). ``ranks[s]`` is the rank running stage s (default: one
    stage per rank). Among equally good splits, the one with the fewest layers in the first
    stages, which hold the most microbatches' activations."""
    ranks = tuple(ranks) if ranks is not None else tuple(range(num_stages))
    extra = [0.0] * num_stages
    extra[0] += embedding
    extra[-1] += head
    if num_stages > n_layers + 2:
        raise ValueError(
            f"{num_stages} pipeline stages but only {n_layers} layers (+ embedding and head); "
            "use fewer stages (pipeline_parallel_degree x stages per rank)"
        )
    sizes = _best_sizes(n_layers, extra, ranks) or _even_sizes(n_layers, num_stages)
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    return tuple(tuple(range(lo, hi)) for lo, hi in zip(bounds, bounds[1:]))


_MAX_SPLITS_TRIED = 20_000


def _best_sizes(n_layers: int, extra: list[float], ranks: tuple[int, ...]) -> tuple | None:
    """Layers per stage, each the floor or ceiling of its share of the work (the middle stages
    at least one), minimizing (busiest rank, busiest stage, then the sizes in order); None when
    no such sizes add up to ``n_layers``."""
    num_stages = len(extra)
    target = (n_layers + sum(extra)) / num_stages
    least = [0 if s in (0, num_stages - 1) else 1 for s in range(num_stages)]
    low = [max(least[s], math.floor(target - extra[s])) for s in range(num_stages)]
    flexible = [s for s in range(num_stages) if target - extra[s] > low[s]]
    grow = n_layers - sum(low)
    if not 0 <= grow <= len(flexible):
        return None
    choices = itertools.combinations(flexible, grow)
    if math.comb(len(flexible), grow) > _MAX_SPLITS_TRIED:  # the largest remainders instead
        share = sorted(flexible, key=lambda s: low[s] + extra[s] - target)
        choices = [tuple(share[:grow])]
    best, best_key = None, None
    for grown in choices:
        sizes = list(low)
        for s in grown:
            sizes[s] += 1
        work = [sizes[s] + extra[s] for s in range(num_stages)]
        per_rank: dict[int, float] = {}
        for s, r in enumerate(ranks):
            per_rank[r] = per_rank.get(r, 0.0) + work[s]
        key = (round(max(per_rank.values()), 9), round(max(work), 9), sizes)
        if best_key is None or key < best_key:
            best, best_key = tuple(sizes), key
    return best


def _even_sizes(n_layers: int, num_stages: int) -> list[int]:
    """The embedding and the head one layer each, the units spread evenly (the fallback)."""
    base, extra = divmod(n_layers + 2, num_stages)
    units = [base + (1 if s < extra else 0) for s in range(num_stages)]
    units[0] -= 1
    units[-1] -= 1
    return units


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
    head_units: float = 1.0,
) -> StagePlan:
    """Without split points or layers per stage, a ``balanced_split`` with the head counted as
    ``head_units`` blocks (``head_units()``). Raises ValueError (one line) for splits that cannot
    work."""
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
        ranks = [rank_of_stage(schedule, stage, pp) for stage in range(num_stages)]
        layers = balanced_split(n_layers, num_stages, head=head_units, ranks=ranks)
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


def build_stage_module(
    model: nn.Module,
    layers: tuple[int, ...],
    first: bool,
    last: bool,
    blocks_attr: str = "layers",
    input_modules: Sequence[str] = ("tok_embeddings",),
    output_modules: Sequence[str] = ("norm", "output"),
) -> nn.Module:
    """A copy of the (meta) model holding the blocks at positions ``layers`` of
    ``model.<blocks_attr>``, the ``input_modules`` (embeddings) iff ``first`` and the
    ``output_modules`` (final norm, head) iff ``last``; the dropped ones are set to None.

    Parameter names stay those of the full model, so checkpoints load into any split: an
    ``nn.ModuleDict`` loses the other stages' keys, an ``nn.ModuleList`` keeps its length with a
    parameterless ``BlockOnAnotherStage`` (returns its first input) in their places.

    The model's forward must run as a stage (Llama's does): skip a module that is None, take the
    previous stage's output (hidden states) as its input when the input modules are None, return
    the hidden states when the output modules are None, and call the blocks in container order
    with the hidden states as their first argument, doing nothing else between them (a
    ModuleList stage's placeholders return their input, and only that).
    """
    _check_present(model, [*input_modules, *output_modules])
    block_items(model, blocks_attr)  # a TypeError unless it is a ModuleDict or ModuleList
    n_blocks = len(getattr(model, blocks_attr))
    if bad := [i for i in layers if not 0 <= i < n_blocks]:
        raise ValueError(f"stage layers {bad} out of range: {blocks_attr} holds {n_blocks} blocks")
    stage = copy.deepcopy(model)
    _keep_blocks(getattr(stage, blocks_attr), set(layers))
    if not first:
        _set_none(stage, input_modules)
    if not last:
        _set_none(stage, output_modules)
    return stage


def _check_present(model: nn.Module, names: Sequence[str]) -> None:
    for name in names:
        try:
            model.get_submodule(name)
        except AttributeError:
            raise ValueError(
                f"{type(model).__name__} has no module {name!r} to leave off pipeline stages; "
                "pass input_modules= / output_modules= naming its embeddings and its norm + head"
            ) from None


def _keep_blocks(container: nn.ModuleDict | nn.ModuleList, keep: set[int]) -> None:
    if isinstance(container, nn.ModuleDict):
        for i, key in enumerate(list(container.keys())):
            if i not in keep:
                del container[key]
        return
    for i in range(len(container)):
        if i not in keep:
            container[i] = BlockOnAnotherStage()


def _set_none(model: nn.Module, names: Sequence[str]) -> None:
    for name in names:
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, None)


class _Stage(PipelineStage):
    """torch's stage, whose first step runs an extra forward of the stage on made-up inputs to
    learn the shapes it sends (``_forward_metadata_inference`` in torch 2.13,
    ``_shape_inference`` before). That forward runs in eval mode here, so layers that keep
    training statistics (the MoE router's expert loads) count only the real microbatches."""


def _in_eval_mode(infer):
    def run(self, *args, **kwargs):
        modes = [(m, m.training) for m in self.submod.modules()]
        self.submod.eval()
        try:
            return infer(self, *args, **kwargs)
        finally:
            for module, training in modes:
                module.training = training

    return run


for _name in ("_forward_metadata_inference", "_shape_inference"):
    if hasattr(PipelineStage, _name):
        setattr(_Stage, _name, _in_eval_mode(getattr(PipelineStage, _name)))


def build_pipeline_stage(module: nn.Module, stage_id: int, plan: StagePlan, device, group):
    return _Stage(module, stage_id, plan.num_stages, device, group=group)


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
