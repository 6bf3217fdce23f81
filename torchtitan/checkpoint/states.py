"""What a checkpoint holds: ``Stateful`` wrappers for the model, optimizer, LR schedule, data
loader and the train loop's progress.

Model and optimizer states are keyed by parameter FQN (the optimizer's too, through
``flatten_optimizer_state_dict``), so a checkpoint written under one FSDP/TP/PP layout loads into
any other: DCP reshards on load. The small Python states travel as one opaque blob each.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from torchtitan.config import ExcludableState, choices
from torchtitan.optim import apply_schedule_lr, resume_lr_scheduler

STATES = ("model", *choices(ExcludableState))
# Identical on every rank by design, so rank 0 alone writes them (one copy, rank-independent).
GLOBAL_STATES = ("lr_scheduler", "dataloader", "train_state")
FLAT_OPTIM = StateDictOptions(flatten_optimizer_state_dict=True)


@dataclass
class TrainState(Stateful):
    """The train loop's own progress: the last completed step and what it has consumed.

    ``settings``: this run's settings that a resume compares (``resume_changes.run_settings``),
    saved with every step; loading puts the checkpoint's in ``saved_settings`` ({} when it
    holds none) and leaves ``settings`` alone.
    """

    step: int = 0
    tokens_seen: int = 0  # global tokens trained on, over all data-parallel ranks
    settings: dict[str, Any] = field(default_factory=dict)
    saved_settings: dict[str, Any] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens_seen": self.tokens_seen, "settings": self.settings}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])
        self.tokens_seen = int(state_dict.get("tokens_seen", 0))
        self.saved_settings = dict(state_dict.get("settings", {}))


StateTransform = Callable[[dict[str, Any]], dict[str, Any]]


def _unchanged(state: dict[str, Any]) -> dict[str, Any]:
    return state


class ModelState(Stateful):
    """Every model part's parameters and buffers, by FQN (clean: no compile/AC wrapper names).

    ``plain_weights`` maps a part's state dict to the tensors to save, sharing their storage
    (Float8 passes ``torchtitan.float8.plain_weights``: no torchao wrapper class is pickled)."""

    def __init__(self, parts: list[nn.Module], plain_weights: StateTransform = _unchanged):
        self.parts = parts
        self.plain_weights = plain_weights
        self._keys: list[list[str]] | None = None

    def state_dict(self) -> dict[str, Any]:
        merged, self._keys = {}, []
        for part in self.parts:
            state = self.plain_weights(get_model_state_dict(part))
            self._keys.append(list(state))
            merged.update(state)
        return merged

    def export_state_dict(self, dtype: torch.dtype) -> dict[str, Any]:
        state = self.state_dict()
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._keys is None:
            self.state_dict()
        for part, keys in zip(self.parts, self._keys):
            set_model_state_dict(part, {k: state_dict[k] for k in keys})


class OptimizerState(Stateful):
    """Each part's optimizer state, flattened to FQN keys (``state.<fqn>.exp_avg``, ...).

    Loading restores the moments (``state.*``: exp_avg, exp_avg_sq, step) only. The param_group
    entries (``param_groups.<fqn>.<entry>``: lr, betas, eps, weight_decay, the implementation
    flags...) are settings, and the resuming run's own win: they stay as this run's config built
    them (the lr is then the schedule's, ``LRSchedulerState.apply_to_optimizers``). Loading puts
    the checkpoint's in ``saved_settings`` and this run's in ``settings``, for the manager to
    report what changed (``resume_changes.describe_optimizer_changes``).
    """

    def __init__(self, parts: list[nn.Module], optimizers: list[torch.optim.Optimizer]):
        self.parts = parts
        self.optimizers = optimizers
        self._keys: list[list[str]] | None = None
        self.settings: dict[str, Any] = {}
        self.saved_settings: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        merged, self._keys = {}, []
        for part, optimizer in zip(self.parts, self.optimizers):
            state = get_optimizer_state_dict(part, optimizer, options=FLAT_OPTIM)
            self._keys.append(list(state))
            merged.update(state)
        self.settings = _param_group_entries(merged)
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._keys is None:
            self.state_dict()
        self.saved_settings = _param_group_entries(state_dict)
        state_dict = {**state_dict, **self.settings}
        for part, optimizer, keys in zip(self.parts, self.optimizers, self._keys):
            part_state = {k: state_dict[k] for k in keys}
            set_optimizer_state_dict(part, optimizer, part_state, options=FLAT_OPTIM)


def _param_group_entries(flat_state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in flat_state.items() if k.startswith("param_groups.")}


class BlobState(Stateful):
    """A small Python state kept as one opaque blob (``torch.save`` bytes).

    DCP would flatten a nested dict into one entry per leaf, and loading needs a template with
    the same leaves; a data loader's state can change shape as it runs (a streaming dataset's
    cursor), so it travels whole. Read back with ``torch.load(weights_only=True)``.
    """

    def __init__(self, get_state: Callable[[], Any], set_state: Callable[[Any], None]):
        self._get_state = get_state
        self._set_state = set_state

    def state_dict(self) -> dict[str, bytes]:
        buffer = io.BytesIO()
        torch.save(self._get_state(), buffer)
        return {"blob": buffer.getvalue()}

    def load_state_dict(self, state_dict: dict[str, bytes]) -> None:
        self._set_state(torch.load(io.BytesIO(state_dict["blob"]), weights_only=True))


class LRSchedulerState(BlobState):
    """The schedulers step in lockstep, so one state (the first's) is saved and loaded into all.

    Loading restores the step count only: the schedule stays this run's (``resume_lr_scheduler``).
    DCP loads the states in key order, so the optimizer's (which puts back the lr its param_groups
    held before loading) comes after this one: the manager calls ``apply_to_optimizers`` once
    everything is loaded.
    """

    def __init__(self, schedulers: list):
        self.schedulers = schedulers
        super().__init__(lambda: schedulers[0].state_dict(), self._set)

    def _set(self, state: dict[str, Any]) -> None:
        for scheduler in self.schedulers:
            resume_lr_scheduler(scheduler, copy.deepcopy(state))

    def apply_to_optimizers(self) -> None:
        """Set each optimizer's lr to its schedule's lr for the next step."""
        for scheduler in self.schedulers:
            apply_schedule_lr(scheduler)


def _as_list(things) -> list:
    """None -> [], one object -> [it], a list or tuple -> a list."""
    if things is None:
        return []
    return list(things) if isinstance(things, list | tuple) else [things]


def training_states(
    model_parts: nn.Module | list[nn.Module],
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] = (),
    lr_schedulers: Any = (),
    dataloader: Any = None,
    train_state: TrainState | None = None,
    plain_weights: StateTransform = _unchanged,
) -> dict[str, Stateful]:
    """The states of a training run, by checkpoint key (in ``STATES`` order; absent ones left out).

    ``optimizers`` and ``lr_schedulers``: one per model part, or none.
    """
    parts = _as_list(model_parts)
    optimizers = _as_list(optimizers)
    lr_schedulers = _as_list(lr_schedulers)
    if optimizers and len(optimizers) != len(parts):
        raise ValueError(f"{len(optimizers)} optimizers for {len(parts)} model parts")
    if lr_schedulers and len(lr_schedulers) != len(optimizers):
        raise ValueError(f"{len(lr_schedulers)} lr schedulers for {len(optimizers)} optimizers")
    states: dict[str, Stateful] = {"model": ModelState(parts, plain_weights)}
    if optimizers:
        states["optimizer"] = OptimizerState(parts, optimizers)
    if lr_schedulers:
        states["lr_scheduler"] = LRSchedulerState(lr_schedulers)
    if dataloader is not None:
        states["dataloader"] = BlobState(dataloader.state_dict, dataloader.load_state_dict)
    if train_state is not None:
        states["train_state"] = BlobState(train_state.state_dict, train_state.load_state_dict)
    return states
