"""What a rejoining replica group takes from a live one (torchft's live recovery): the model,
optimizer and lr schedule, the data loader's position, the train state and the step.

Tensors travel as this rank's local shards: torchft pairs rank r of the rejoining group with
rank r of a live one, which has the same layout and so the same shards. They are copied into
the existing parameters, so the rejoined weights are the live ones bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from torchtitan.fault_tolerance.gradients import local


class LiveState:
    """``state_dict`` / ``load_state_dict`` registered with the torchft Manager.

    ``progress``: the steps a group that heals from this one continues from (the trainer keeps
    it current); ``adopted``: that number after this group healed, until the trainer takes it.
    """

    def __init__(self, model_parts, optimizers, lr_schedulers, dataloader, train_state):
        self.model_parts: list[nn.Module] = model_parts
        self.optimizers: list[torch.optim.Optimizer] = optimizers
        self.lr_schedulers = lr_schedulers
        self.dataloader = dataloader
        self.train_state = train_state
        self.progress = 0
        self.adopted: int | None = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.progress,
            "model": [_local_tensors(part.state_dict()) for part in self.model_parts],
            "optimizer": [_local_tensors(opt.state_dict()) for opt in self.optimizers],
            "lr_scheduler": [s.state_dict() for s in self.lr_schedulers],
            "dataloader": self.dataloader.state_dict(),
            "train_state": self.train_state.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for part, saved in zip(self.model_parts, state["model"], strict=True):
                ours = part.state_dict()
                for name, tensor in saved.items():
                    local(ours[name]).copy_(tensor)
        for optimizer, saved in zip(self.optimizers, state["optimizer"], strict=True):
            optimizer.load_state_dict(_as_parameters(optimizer, saved))
        for scheduler, saved in zip(self.lr_schedulers, state["lr_scheduler"], strict=True):
            scheduler.load_state_dict(saved)
        self.dataloader.load_state_dict(state["dataloader"])
        self.train_state.load_state_dict(state["train_state"])
        self.adopted = state["step"]

    def take_adopted(self) -> int | None:
        adopted, self.adopted = self.adopted, None
        return adopted


def _local_tensors(tree):
    if isinstance(tree, dict):
        return {key: _local_tensors(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_local_tensors(value) for value in tree]
    return tree.to_local() if isinstance(tree, DTensor) else tree


def _as_parameters(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """A received optimizer state dict whose per-parameter tensors (local shards) are made
    DTensors again, laid out like their parameters (the optimizer may have no state yet, e.g.
    in a group restarted from its first step, so there is nothing to copy into)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, values in saved["state"].items():
        param = params[index]
        state[index] = {
            name: _like(param, value) if isinstance(value, torch.Tensor) else value
            for name, value in values.items()
        }
    return {**saved, "state": state}


def _like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    if not isinstance(param, DTensor) or value.shape != param.to_local().shape:
        return value  # a scalar such as Adam's step, or a plain parameter's state
    return DTensor.from_local(
        value.to(param.to_local().device),
        param.device_mesh,
        param.placements,
        run_check=False,
        shape=param.shape,
        stride=param.stride(),
    )
