"""FSDP's all-gathers on the GPU's copy engines, which leaves every SM to the matmuls they overlap.

NCCL's ring all-gather runs as 24 thread blocks here. While it runs, the matmul beside it loses
about a fifth of its speed (docs/performance.md). This all-gather moves the bytes
with ``cudaMemcpyAsync`` between GPUs of one node instead, which the copy engines carry out.

Each all-gather output lives in one of two buffers in torch's CUDA symmetric memory, which every
rank of the shard group maps. One all-gather goes:

1. FSDP's copy-in writes this rank's shard into its own slot of the buffer (the all-gather runs
   in place);
2. a barrier: every rank's shard is in place;
3. this rank copies every other rank's slot out of that rank's buffer into its own;
4. a barrier: no rank reuses its buffer while another still reads it.

Two buffers are enough because FSDP orders its streams. An all-gather's copy-in waits for the
copy-out of the all-gather before the last one, and that copy-out waited for that all-gather
(step 4 included). So the buffer, which they share, is free again on this rank and every peer.

Buffers are made per output size, at the first all-gather of that size (all ranks ask for the
same sizes in the same order), and live as long as the process. They sit outside the caching
allocator, so each all-gather counts its ``symmetric_bytes`` and logs them beside the peak.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist

logger = logging.getLogger("torchtitan")


def local_gpus() -> int:
    """GPUs of this node the job runs on (torchrun's LOCAL_WORLD_SIZE, else those visible)."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return torch.cuda.device_count() if torch.cuda.is_available() else 1


FLAG = "--experimental.fsdp_copy_engine_all_gather"


def copy_engine_problem(fsdp_degree: int, tp: int, gpus_per_node: int, pp: int = 1) -> str | None:
    """Why ``--experimental.fsdp_copy_engine_all_gather`` cannot run, or None. Without CUDA it
    has no effect (CPU runs keep working from the same config)."""
    if not torch.cuda.is_available():
        return None
    if pp > 1:  # the schedules unshard stages themselves; the buffer reuse is not argued for it
        return f"{FLAG} is not supported with pipeline parallel; turn it off"
    from torch.distributed.fsdp import FSDPModule

    if not hasattr(FSDPModule, "set_custom_all_gather"):
        return (
            f"{FLAG} needs FSDP2's set_custom_all_gather, which torch {torch.__version__} "
            "lacks; turn it off"
        )
    span = (fsdp_degree - 1) * tp + 1  # the shard group's ranks are tp apart
    if span > gpus_per_node:
        return (
            f"{FLAG} copies between GPUs of one node, but FSDP's shard group spans {span} ranks "
            f"({fsdp_degree} shards, {tp} apart) and a node has {gpus_per_node} GPUs; turn it "
            "off, or use HSDP with shards that fit a node"
        )
    if not peers_reachable(gpus_per_node):
        return f"{FLAG}: this node's GPUs cannot all map each other's memory; turn it off"
    return None


def peers_reachable(gpus_per_node: int) -> bool:
    """Whether every pair of this node's GPUs can map each other's memory (what symmetric memory
    needs); False when a rank sees fewer GPUs than the node runs, so it cannot tell."""
    if torch.cuda.device_count() < gpus_per_node:
        return False
    gpus = range(gpus_per_node)
    return all(torch.cuda.can_device_access_peer(a, b) for a in gpus for b in gpus if a != b)


class SymmetricBufferPair:
    """Two buffers of ``nbytes`` in torch's CUDA symmetric memory, with every rank's view of
    each (``peer_views[i][rank]``) and a barrier over the group per buffer (``handles[i]``)."""

    def __init__(self, nbytes: int, group: dist.ProcessGroup, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem

        with warnings.catch_warnings():  # needed by torch 2.11, deprecated by 2.13
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group.group_name)
        self.buffers, self.handles, self.peer_views = [], [], []
        for _ in range(2):
            buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
            handle = symm_mem.rendezvous(buffer, group.group_name)
            self.buffers.append(buffer)
            self.handles.append(handle)
            self.peer_views.append(
                [handle.get_buffer(peer, (nbytes,), torch.uint8) for peer in range(group.size())]
            )


class CopyEngineAllGather:
    """An FSDP2 all-gather (``FSDPModule.set_custom_all_gather``) over the copy engines; one
    instance serves every module that FSDP shards over ``group``. ``make_pair`` makes the
    buffers (tests pass one that shares files between CPU processes)."""

    def __init__(self, group: dist.ProcessGroup, make_pair=SymmetricBufferPair):
        self.group = group
        self.make_pair = make_pair
        self.pairs: dict[int, object] = {}
        self.taken: dict[int, int] = {}  # all-gathers so far, per output size
        self.symmetric_bytes = 0

    def allocate(
        self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        nbytes = math.prod(int(s) for s in size) * dtype.itemsize
        if nbytes not in self.pairs:
            self.pairs[nbytes] = self.make_pair(nbytes, self.group, device)
            self.taken[nbytes] = 0
            self.symmetric_bytes += 2 * nbytes
            logger.info(
                "copy-engine all-gather: 2 x %.0f MiB of symmetric memory for outputs of this "
                "size, %.2f GiB in all (outside the caching allocator's peak memory figure)",
                nbytes / 2**20,
                self.symmetric_bytes / 2**30,
            )
        index = self.taken[nbytes] % 2
        self.taken[nbytes] += 1
        return self.pairs[nbytes].buffers[index].view(dtype).view(*size)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> None:
        pair = self.pairs[output_tensor.numel() * output_tensor.element_size()]
        index = next(
            i for i, b in enumerate(pair.buffers) if b.data_ptr() == output_tensor.data_ptr()
        )
        rank, world = group.rank(), group.size()
        shard = input_tensor.numel() * input_tensor.element_size()
        if input_tensor.data_ptr() != output_tensor.data_ptr() + rank * shard:
            raise RuntimeError("copy-engine all-gather: FSDP's input is not in place")
        ours, views = pair.buffers[index], pair.peer_views[index]
        pair.handles[index].barrier(channel=0)
        for step in range(1, world):
            peer = (rank + step) % world
            start = peer * shard
            ours[start : start + shard].copy_(views[peer][start : start + shard])
        pair.handles[index].barrier(channel=0)
        return None


def use_copy_engine_all_gather(
    modules: Sequence[torch.nn.Module], group: dist.ProcessGroup, make_pair=SymmetricBufferPair
) -> CopyEngineAllGather:
    """Give ``modules`` (FSDP-sharded over ``group``) one shared copy-engine all-gather."""
    comm = CopyEngineAllGather(group, make_pair)
    for module in modules:
        module.set_custom_all_gather(comm)
    logger.info("FSDP: %d blocks all-gathered by the copy engines", len(modules))
    return comm
