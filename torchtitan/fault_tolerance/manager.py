"""This replica group's torchft ``Manager`` and the process group that joins its ranks to the
same ranks of the other groups (rank r of every group holds the same shards, so they exchange
gradients, and live state, pairwise)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from torchtitan.config import FaultTolerance
from torchtitan.fault_tolerance.checks import import_torchft, lighthouse_address

# The keys torchft's Manager publishes in the group's store (torchrun's): rank 0's manager
# address and the replica id.
MANAGER_STORE_KEYS = ("manager_addr", "replica_id")


def replica_backend(ft: FaultTolerance, device: torch.device) -> str:
    if ft.process_group != "auto":
        return ft.process_group
    return "nccl" if device.type == "cuda" else "gloo"


def build_manager(ft: FaultTolerance, device: torch.device, init_sync: bool):
    """The Manager of this group (rank 0 runs its server and talks to the lighthouse), with a
    synchronous quorum: a rejoining group heals before its step's forward, and DiLoCo needs it.
    ``init_sync``: the groups did not all load the same weights, so at step 0 they take one
    group's."""
    import_torchft()
    from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL
    from torchft.manager import ReduceOp

    class ReplicaManager(Manager):
        """torchft's Manager, counting what it all-reduces across replica groups."""

        allreduce_calls = 0
        allreduce_elements = 0

        def allreduce(self, tensor, should_quantize=False, reduce_op=ReduceOp.AVG):
            self.allreduce_calls += 1
            self.allreduce_elements += tensor.numel()
            return super().allreduce(tensor, should_quantize=should_quantize, reduce_op=reduce_op)

    timeout = timedelta(seconds=ft.timeout_seconds)
    backend = replica_backend(ft, device)
    pg = ProcessGroupNCCL(timeout=timeout) if backend == "nccl" else ProcessGroupGloo(timeout)
    _forget_previous_attempt()
    return ReplicaManager(
        pg=pg,
        load_state_dict=None,
        state_dict=None,
        min_replica_size=ft.min_replica_size,
        use_async_quorum=False,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=ft.quorum_timeout_seconds),
        connect_timeout=timedelta(seconds=ft.connect_timeout_seconds),
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        lighthouse_addr=lighthouse_address(ft),
        # torchft reads the group's index from the id's trailing digits.
        replica_id=f"replica_{ft.replica_id}",
        init_sync=init_sync,
    )


def _forget_previous_attempt() -> None:
    """A group restarted by torchrun reuses torchrun's store, where the previous attempt's
    manager address is still published: rank 0 removes it before its new manager publishes
    one, so that the other ranks wait for the new address instead of dialing a dead one."""
    if dist.get_rank() == 0:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            wait_for_workers=False,
        )
        for key in MANAGER_STORE_KEYS:
            store.delete_key(key)
    dist.barrier()
