"""Expert parallelism for the Mixture-of-Experts layers, and how their weights are sharded.

With ``expert_parallel_degree = ep`` the ``ep`` ranks of an expert-parallel group each hold
``num_experts / ep`` of every MoE layer's experts (a DTensor sharded on the expert dimension,
so checkpoints hold whole layers and load under any other degree). A layer's tokens, already
sorted by expert, travel to the rank holding their expert by one all-to-all with uneven splits,
run through the local experts as grouped GEMMs, and travel back by a second all-to-all; both
carry gradients. The splits are read on the host (one sync per layer and direction): the
receiving side must know how many rows arrive.

The ranks of an expert-parallel group come from ``dp_shard x cp x tp`` (``ParallelDims``): all of
them hold different tokens when the MoE layer runs, under TP too, since the layer runs on each
rank's sequence shard instead of splitting the experts' matmuls (whose per-expert shapes are too
small to split again). FSDP then shards each expert slice over the remaining ``efsdp`` ranks.

Gradient scale: every FSDP group of a MoE layer divides its summed gradients by the
data-parallel degree (``dp_replicate x dp_shard x cp``), as the dense weights' FSDP averaging
does; an expert's gradient is already summed over every token that reached it, from any rank.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from torchtitan.models.common.load_balance import moe_layers


def has_moe(module: nn.Module) -> bool:
    return bool(moe_layers(module))


def check_expert_parallel(num_experts: int | None, ep: int) -> str | None:
    """Why ``ep`` cannot split these experts (one line), or None."""
    if ep == 1:
        return None
    if num_experts is None:
        return (
            f"--parallelism.expert_parallel_degree {ep} needs a MoE flavor; this model has no "
            "experts: drop the option or pick a MoE flavor"
        )
    if num_experts % ep:
        return (
            f"--parallelism.expert_parallel_degree {ep} must divide the {num_experts} experts "
            "of each MoE layer"
        )
    return None


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Keep this rank's slice of every MoE layer's experts and route tokens to their owners."""
    ep = ep_mesh.size()
    rank = ep_mesh.get_local_rank()
    group = ep_mesh.get_group()
    for _, moe in moe_layers(model):
        experts = moe.experts
        for name, param in list(experts.named_parameters(recurse=False)):
            local = param.detach().chunk(ep, dim=0)[rank]
            sharded = DTensor.from_local(local, ep_mesh, [Shard(0)], run_check=False)
            experts.register_parameter(name, nn.Parameter(sharded, param.requires_grad))
        experts.register_forward_pre_hook(partial(_dispatch, group, ep))
        experts.register_forward_hook(partial(_combine, group))


@torch.compiler.disable
def _dispatch(group, ep: int, experts: nn.Module, args):
    """(rows sorted by global expert, rows per expert) -> the rows of this rank's experts from
    every rank, sorted by local expert, and their counts."""
    rows, counts = args
    local_experts = counts.shape[0] // ep
    send = counts.to(torch.int64)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    received = received.view(ep, local_experts)  # [source rank, local expert]
    in_splits = send.view(ep, local_experts).sum(1).tolist()
    out_splits = received.sum(1).tolist()
    arrived = funcol.all_to_all_single_autograd(rows, out_splits, in_splits, group)
    order = _expert_major_order(received)
    experts._ep_exchange = (in_splits, out_splits, order)
    return arrived[order], received.sum(0)


@torch.compiler.disable
def _combine(group, experts: nn.Module, args, out: torch.Tensor) -> torch.Tensor:
    """The local experts' outputs back to the ranks their rows came from, in their order."""
    in_splits, out_splits, order = experts._ep_exchange
    del experts._ep_exchange
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return funcol.all_to_all_single_autograd(out[inverse], in_splits, out_splits, group)


def _expert_major_order(received: torch.Tensor) -> torch.Tensor:
    """Indices that reorder rows arriving grouped by (source rank, local expert) into groups by
    (local expert, source rank)."""
    sources, experts = received.shape
    starts = (torch.cumsum(received.flatten(), 0) - received.flatten()).view(sources, experts)
    lengths = received.t().flatten()
    total = int(received.sum())
    segment_starts = starts.t().flatten()
    offsets_in_result = torch.cumsum(lengths, 0) - lengths
    within = torch.arange(total, device=received.device) - torch.repeat_interleave(
        offsets_in_result, lengths, output_size=total
    )
    return torch.repeat_interleave(segment_starts, lengths, output_size=total) + within


def fully_shard_moe_layers(
    model: nn.Module,
    experts_mesh: DeviceMesh | None,
    dense_mesh: DeviceMesh | None,
    mp_policy: MixedPrecisionPolicy,
    reshard: bool,
    divide_factor: int,
) -> None:
    """FSDP groups of their own for the MoE layers' weights that live on other meshes than the
    blocks': the expert slices (``experts_mesh``, under expert parallelism) and, under TP, the
    router and shared experts (``dense_mesh``). Runs before the blocks are sharded, which then
    leave these weights alone."""
    for _, moe in moe_layers(model):
        groups = []
        if experts_mesh is not None:
            groups.append((moe.experts, experts_mesh))
        if dense_mesh is not None:
            groups.append((moe, dense_mesh))
        for module, mesh in groups:
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp_policy)
            module.set_gradient_divide_factor(float(divide_factor))
            if mesh.device_type != "cuda" and mesh.size() > 1:
                # A divide factor other than the group size is NCCL's PREMUL_SUM, which gloo
                # lacks: sum, then divide. (Not on one rank, where torch 2.13 then divides
                # twice.)
                module.set_force_sum_reduction_for_comms(True)
