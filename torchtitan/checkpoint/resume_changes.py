"""What changed between the run that wrote a checkpoint and the run resuming it, one line each.

The trainer records ``run_settings`` in its ``TrainState``; every checkpoint carries them, and
``describe_changes`` compares the loaded ones with the current run's. The optimizer's
hyperparameters are read from its param_groups, which every checkpoint holds:
``describe_optimizer_changes``.
"""

from __future__ import annotations

import logging
from typing import Any

from torchtitan.config import JobConfig

# Settings the lr schedule is a function of (with the step): a change applies from the next step.
SCHEDULE_SETTINGS = (
    "training.steps",
    "optimizer.lr",
    "lr_scheduler.warmup_steps",
    "lr_scheduler.decay_type",
    "lr_scheduler.min_lr_ratio",
)
# Settings that change what one step trains on.
BATCH_SETTINGS = ("global batch size", "training.seq_len")
# Optimizer param_group entries not reported: the lr is the schedule's (SCHEDULE_SETTINGS say
# when it changed), and the implementation flags are each run's own choice of kernel (a CPU
# run's foreach checkpoint resumes fused on GPU).
UNREPORTED_PARAM_GROUP_ENTRIES = (
    "lr",
    "initial_lr",
    "foreach",
    "fused",
    "capturable",
    "differentiable",
)


def run_settings(cfg: JobConfig, global_batch_size: int) -> dict[str, Any]:
    """The settings of ``cfg`` a resume compares; ``global_batch_size``: samples per optimizer
    step (the effective one, not the option's -1)."""
    return {
        "training.steps": cfg.training.steps,
        "optimizer.lr": cfg.optimizer.lr,
        "lr_scheduler.warmup_steps": cfg.lr_scheduler.warmup_steps,
        "lr_scheduler.decay_type": cfg.lr_scheduler.decay_type,
        "lr_scheduler.min_lr_ratio": cfg.lr_scheduler.min_lr_ratio,
        "global batch size": global_batch_size,
        "training.seq_len": cfg.training.seq_len,
    }


def _changed(saved: dict, current: dict, names: tuple[str, ...]) -> str:
    """``name changed a -> b, ...`` for the names both know and that differ ("" if none)."""
    return ", ".join(
        f"{name} changed {saved[name]} -> {current[name]}"
        for name in names
        if name in saved and name in current and saved[name] != current[name]
    )


def describe_changes(
    saved: dict, current: dict, next_step: int, lr: float | None
) -> list[tuple[int, str]]:
    """(logging level, line) for each kind of change; ``lr``: the lr of ``next_step``."""
    lines = []
    if schedule := _changed(saved, current, SCHEDULE_SETTINGS):
        at = f" (lr {lr:.2e})" if lr is not None else ""
        lines.append(
            (
                logging.INFO,
                f"{schedule} since the checkpoint: the lr schedule follows the new settings "
                f"from step {next_step}{at}",
            )
        )
    if batch := _changed(saved, current, BATCH_SETTINGS):
        lines.append(
            (
                logging.WARNING,
                f"{batch} since the checkpoint: from step {next_step} each step trains on a "
                "different number of tokens (the data continues where the checkpoint stopped)",
            )
        )
    return lines


def _named_values(entry: str, saved: Any, current: Any) -> list[tuple[str, Any, Any]]:
    """(option name, saved, current) of one param_group entry; ``betas`` is two options."""
    if entry == "betas" and len(saved) == len(current) == 2:
        return [(f"optimizer.beta{i + 1}", saved[i], current[i]) for i in range(2)]
    return [(f"optimizer.{entry}", saved, current)]


def optimizer_changes(saved: dict[str, Any], current: dict[str, Any]) -> str:
    """``optimizer.weight_decay changed 0.1 -> 0.05, ...`` between two sets of flattened
    ``param_groups.<fqn>.<entry>`` entries, each distinct change once ("" if none)."""
    changes: dict[str, None] = {}  # ordered set
    for key, now in current.items():
        entry = key.rsplit(".", 1)[1]
        if key not in saved or entry in UNREPORTED_PARAM_GROUP_ENTRIES:
            continue
        for name, old, new in _named_values(entry, saved[key], now):
            if bool(old != new):
                changes[f"{name} changed {old} -> {new}"] = None
    return ", ".join(changes)


def describe_optimizer_changes(
    saved: dict[str, Any], current: dict[str, Any], next_step: int
) -> list[tuple[int, str]]:
    """(logging level, line) when the optimizer's hyperparameters changed: the new ones apply."""
    if not (changed := optimizer_changes(saved, current)):
        return []
    return [
        (
            logging.INFO,
            f"{changed} since the checkpoint: the optimizer uses the new settings from step "
            f"{next_step}; its moments (exp_avg, exp_avg_sq, step) continue from the checkpoint",
        )
    ]
