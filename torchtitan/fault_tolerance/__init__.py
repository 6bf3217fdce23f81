"""Replica-level fault tolerance through torchft (docs/fault_tolerance.md).

Several replica groups, each a torchrun job with its own FSDP/TP/PP/CP layout, train one model:
the replica dimension takes the place of HSDP's replicate dimension. A group that dies drops
out and the others keep stepping; restarted, it takes the live weights from a peer. torchft is
imported only when ``[fault_tolerance] enable`` is on (``pip install -e ".[ft]"``).

    checks.py       one-line errors before any process group: torchft missing, the lighthouse,
                    combinations torchft cannot run
    manager.py      this group's torchft Manager and its cross-replica process group
    gradients.py    gradients averaged across replica groups (FSDP2 all-reduce hook)
    live_state.py   what a rejoining group takes from a live one
    semi_sync.py    LocalSGD and DiLoCo
    probe.py        test-only record of the weights per step (``TORCHTITAN_FT_PROBE``)
    replicas.py     ``ReplicaGroup``: the one object the trainer calls
"""

from torchtitan.fault_tolerance.checks import fault_tolerance_problem, replica_groups
from torchtitan.fault_tolerance.replicas import ReplicaGroup

__all__ = ["ReplicaGroup", "fault_tolerance_problem", "replica_groups"]
