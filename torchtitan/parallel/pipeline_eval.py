"""A forward-only pass through the pipeline stages (validation), independent of the schedule.

PyTorch's ``schedule.eval()`` runs a schedule's actions without the backward, but in torch 2.13
the V-shaped schedules (ZBVZeroBubble, DualPipeV), whose ranks hand activations to their own
next stage, still take the backward path there and fail; and before 2.13 a schedule prepares its
communication buffers once, for the shapes of its first call. So validation walks the stages
itself: every rank goes through the same sequence (microbatch, stage), runs the stages it holds,
receives a stage's input from the rank holding the previous stage (or takes it locally when it
holds both) and sends its output on with ``isend``. A receive only waits for an earlier item of
that common sequence, so the walk cannot deadlock, and ranks overlap on different microbatches as
in GPipe's fill phase. Each transfer carries a small header (dtype, shape), so any microbatch size
and any sharding of the activations (sequence parallel, context parallel) goes through.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from torchtitan.parallel.pipeline import StagePlan, stage_ids_for_rank

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
HEADER_LEN = 8  # dtype index, ndim, up to 6 dims

StageLoss = Callable[[torch.Tensor, int], torch.Tensor]  # (last stage's output, microbatch) -> sum


def stage_owners(schedule: str, pp: int, num_stages: int) -> dict[int, int]:
    """Stage index -> the pipeline rank that holds it (as ``plan_stages`` assigns them)."""
    per_rank = num_stages // pp
    return {s: r for r in range(pp) for s in stage_ids_for_rank(schedule, r, pp, per_rank)}


class PipelineForward:
    """Runs microbatches through every stage, forward only (call it under ``torch.no_grad``)."""

    def __init__(
        self,
        parts: list[nn.Module],
        plan: StagePlan,
        schedule: str,
        group: dist.ProcessGroup,
        device: torch.device,
    ):
        self.stages = dict(zip(plan.stage_ids, parts))
        self.num_stages = plan.num_stages
        self.rank = dist.get_rank(group)
        self.owners = stage_owners(schedule, dist.get_world_size(group), plan.num_stages)
        self.group, self.device = group, device

    def summed_loss(
        self,
        microbatches: list[torch.Tensor],
        stage_loss: StageLoss,
        stage_kwargs: list[dict] | None = None,
    ) -> torch.Tensor:
        """The sum of ``stage_loss`` over the microbatches on the rank holding the last stage;
        0 elsewhere. ``microbatches``: the first stage's inputs (every rank passes them);
        ``stage_kwargs``: each microbatch's keyword arguments for every stage."""
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        in_flight: list[list[dist.Work]] = []
        for index, inputs in enumerate(microbatches):
            kwargs = stage_kwargs[index] if stage_kwargs else {}
            if len(in_flight) == 2:  # bound the activations held for sends
                for work in in_flight.pop(0):
                    work.wait()
            sends: list[dist.Work] = []
            carried = inputs
            for stage in range(self.num_stages):
                if self.owners[stage] != self.rank:
                    continue
                if stage > 0 and self.owners[stage - 1] != self.rank:
                    carried = self._receive(self.owners[stage - 1])
                output = self.stages[stage](carried, **kwargs)
                if stage == self.num_stages - 1:
                    total += stage_loss(output, index)
                elif self.owners[stage + 1] == self.rank:
                    carried = output
                else:
                    sends += self._send(output, self.owners[stage + 1])
            in_flight.append(sends)
        for sends in in_flight:
            for work in sends:
                work.wait()
        return total

    def _send(self, tensor: torch.Tensor, to: int) -> list[dist.Work]:
        tensor = tensor.contiguous()
        header = torch.zeros(HEADER_LEN, dtype=torch.int64)
        header[0], header[1] = DTYPES.index(tensor.dtype), tensor.dim()
        header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape)
        header = header.to(self.device)
        return [
            dist.isend(header, group=self.group, group_dst=to),
            dist.isend(tensor, group=self.group, group_dst=to),
        ]

    def _receive(self, source: int) -> torch.Tensor:
        header = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.device)
        dist.recv(header, group=self.group, group_src=source)
        dtype, ndim, *shape = header.tolist()
        tensor = torch.empty(shape[:ndim], dtype=DTYPES[dtype], device=self.device)
        dist.recv(tensor, group=self.group, group_src=source)
        return tensor
