"""The ``[fault_tolerance]`` section: replica groups that drop out and rejoin through torchft
(``torchtitan/fault_tolerance/``, docs/fault_tolerance.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torchtitan.config.base import Section, _check, opt

ReplicaBackend = Literal["auto", "gloo", "nccl"]
SemiSyncMethod = Literal["none", "local_sgd", "diloco"]


@dataclass
class FaultTolerance(Section):
    enable: bool = opt(
        False, "train as one replica group of several through torchft (needs pip install .[ft])"
    )
    replica_id: int = opt(0, "this replica group's index, 0 <= replica_id < group_size")
    group_size: int = opt(0, "number of replica groups (each a torchrun job of its own)")
    min_replica_size: int = opt(1, "live replica groups needed to commit a step")
    lighthouse: str = opt(
        "", "torchft lighthouse address http://host:port; empty = $TORCHFT_LIGHTHOUSE"
    )
    process_group: ReplicaBackend = opt(
        "auto", "backend of the cross-replica process group: auto = nccl on GPU, gloo on CPU"
    )
    timeout_seconds: int = opt(
        60, "cross-replica collectives, commits and live recovery end with an error after this"
    )
    quorum_timeout_seconds: int = opt(
        120, "how long a group waits for the lighthouse to form a quorum"
    )
    connect_timeout_seconds: int = opt(
        10, "how long to wait for the lighthouse to answer before giving up at start"
    )
    semi_sync: SemiSyncMethod = opt(
        "none",
        "none: average gradients every step; local_sgd: average weights every sync_every steps; "
        "diloco: an outer optimizer step on the averaged weight change every sync_every steps",
    )
    sync_every: int = opt(20, "with semi_sync: local steps between two synchronizations")
    outer_lr: float = opt(0.7, "diloco: learning rate of the outer SGD (Nesterov momentum)")
    outer_momentum: float = opt(0.9, "diloco: momentum of the outer SGD")
    fragments: int = opt(
        1, "diloco: model fragments synchronized in turn (streaming DiLoCo); divides sync_every"
    )

    def validate(self) -> None:
        super().validate()
        key = "--fault_tolerance"
        if not self.enable:
            _check(
                self.semi_sync == "none",
                f"{key}.semi_sync {self.semi_sync} needs {key}.enable (it synchronizes replica "
                "groups through torchft)",
            )
            return
        _check(
            self.group_size >= 1,
            f"{key}.group_size must be the number of replica groups (>= 1); got {self.group_size}",
        )
        _check(
            0 <= self.replica_id < self.group_size,
            f"{key}.replica_id {self.replica_id} is outside the {self.group_size} replica groups; "
            f"use 0 ... {self.group_size - 1}",
        )
        _check(
            1 <= self.min_replica_size <= self.group_size,
            f"{key}.min_replica_size must be in [1, group_size={self.group_size}]; got "
            f"{self.min_replica_size}",
        )
        for name in ("timeout_seconds", "quorum_timeout_seconds", "connect_timeout_seconds"):
            value = getattr(self, name)
            _check(value > 0, f"{key}.{name} must be positive; got {value}")
        self._validate_semi_sync(key)

    def _validate_semi_sync(self, key: str) -> None:
        _check(self.sync_every >= 1, f"{key}.sync_every must be >= 1; got {self.sync_every}")
        _check(
            self.fragments == 1 or self.semi_sync == "diloco",
            f"{key}.fragments {self.fragments} needs {key}.semi_sync diloco",
        )
        _check(
            self.fragments >= 1 and self.sync_every % self.fragments == 0,
            f"{key}.fragments must be >= 1 and divide sync_every={self.sync_every}; got "
            f"{self.fragments}",
        )
        _check(self.outer_lr > 0, f"{key}.outer_lr must be positive; got {self.outer_lr}")
        _check(
            0 <= self.outer_momentum < 1,
            f"{key}.outer_momentum must be in [0, 1); got {self.outer_momentum}",
        )
