"""Gradients averaged across replica groups through the torchft Manager.

Inside a group FSDP2 reduce-scatters each block's gradients as usual; its all-reduce hook (the
extension point FSDP2 offers for the replicate dimension of HSDP) then averages the shard with
the same shard of every live group. That overlaps with the rest of the backward like HSDP's own
all-reduce. A group without FSDP (one rank, or TP/PP only) averages each parameter's gradient
once it is accumulated instead (one collective per parameter: slower, same result).
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (its storage: in-place changes reach the DTensor)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def average_across_replicas(manager, tensor: torch.Tensor) -> None:
    """``tensor`` <- its mean over the live replica groups, in place. A failed exchange (a group
    died) leaves it unchanged and makes the manager refuse to commit the step."""
    manager.allreduce(tensor).wait()


def average_gradients_across_replicas(model_parts: list[nn.Module], manager) -> str:
    """Install the averaging on every model part; -> how, for the start-up log."""
    fsdp = [m for part in model_parts for m in part.modules() if isinstance(m, FSDPModule)]
    average = functools.partial(average_across_replicas, manager)
    if fsdp:
        for module in fsdp:
            module.set_all_reduce_hook(average)
        return "FSDP2 all-reduce hook"

    def after_accumulation(param: torch.Tensor) -> None:
        average(local(param.grad))

    for part in model_parts:
        for param in part.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(after_accumulation)
    return "per-parameter gradient hooks (no FSDP in the group)"
