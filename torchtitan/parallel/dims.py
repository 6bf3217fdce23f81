"""Parallelism degrees -> one DeviceMesh ordered (pp, dp_replicate, dp_shard, cp, tp).

The mesh always has all five dimensions (size 1 where a parallelism is off), so every consumer can
ask for the dimension it needs by name. The flattened meshes the rest of the code uses:

* ``fsdp_mesh``: parameters are sharded over dp_shard x cp (context-parallel ranks hold the same
  weights, so they shard them too); 2-D (dp_replicate, dp_shard_cp) for HSDP / DDP.
* ``loss_mesh``: dp_replicate x dp_shard x cp, where the per-token loss is averaged.
* ``dp_rank`` / ``dp_degree``: which share of the data this rank loads.

Mixture-of-Experts layers see every rank of a pipeline stage as holding different tokens (under
TP they run on each rank's sequence shard), so their meshes split ``dp_shard x cp x tp`` instead:
``ep`` consecutive ranks of it share one layer's experts (expert parallel) and the ``efsdp``
groups of those shard each expert slice with FSDP (``moe_meshes``, built on first use).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchtitan.config import ConfigError, Parallelism

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


class DerivedDegrees:
    """Sizes that follow from the five degrees; shared by ``ParallelDims`` and the planner's
    ``Layout`` (``planning/layout.py``), which both have them as attributes."""

    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int

    @property
    def dp_degree(self) -> int:
        """Data-parallel ranks: each loads its own share of the data."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_degree(self) -> int:
        """Ranks one parameter is sharded over (CP ranks join the FSDP mesh)."""
        return self.dp_shard * self.cp

    @property
    def model_parallel_size(self) -> int:
        """Devices that share one data-parallel replica's work (pp x cp x tp)."""
        return self.pp * self.cp * self.tp

    @property
    def parameters_distributed(self) -> bool:
        """Whether parameters become DTensors (FSDP/HSDP/DDP or TP); not under PP alone."""
        return self.data_parallel or self.tp > 1

    @property
    def data_parallel(self) -> bool:
        """Any kind of gradient averaging across replicas (FSDP, HSDP or DDP): FSDP2 wraps the
        model whenever a replica or shard group has more than one rank."""
        return self.dp_replicate * self.fsdp_degree > 1


@dataclass
class ParallelDims(DerivedDegrees):
    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    world_size: int
    ep: int = 1
    _meshes: dict[str, DeviceMesh] = field(default_factory=dict, repr=False)
    _device_type: str = field(default="cpu", repr=False)

    @classmethod
    def from_config(cls, p: Parallelism, world_size: int) -> ParallelDims:
        """Resolve ``data_parallel_shard_degree = -1`` and check the degrees fill the world."""
        degrees = {
            "pipeline_parallel_degree": p.pipeline_parallel_degree,
            "data_parallel_replicate_degree": p.data_parallel_replicate_degree,
            "context_parallel_degree": p.context_parallel_degree,
            "tensor_parallel_degree": p.tensor_parallel_degree,
        }
        for name, value in degrees.items():
            if value < 1:
                raise ConfigError(f"--parallelism.{name} must be >= 1; got {value}")
        others = math.prod(degrees.values())
        dp_shard = p.data_parallel_shard_degree
        if dp_shard == -1:
            if world_size % others:
                raise ConfigError(
                    f"the world size {world_size} is not divisible by the product {others} of "
                    f"{_listing(degrees)}; change the degrees or the number of processes"
                )
            dp_shard = world_size // others
        elif dp_shard < 1:
            raise ConfigError(
                f"--parallelism.data_parallel_shard_degree must be >= 1 or -1; got {dp_shard}"
            )
        if dp_shard * others != world_size:
            degrees["data_parallel_shard_degree"] = dp_shard
            raise ConfigError(
                f"the parallel degrees multiply to {dp_shard * others} but the world size is "
                f"{world_size} ({_listing(degrees)}); make the product equal the process count"
            )
        ep = p.expert_parallel_degree
        token_ranks = dp_shard * p.context_parallel_degree * p.tensor_parallel_degree
        if ep < 1 or token_ranks % ep:
            raise ConfigError(
                f"--parallelism.expert_parallel_degree {ep} must be >= 1 and divide "
                f"dp_shard x cp x tp = {token_ranks}, the ranks it borrows from"
            )
        return cls(
            ep=ep,
            pp=p.pipeline_parallel_degree,
            dp_replicate=p.data_parallel_replicate_degree,
            dp_shard=dp_shard,
            cp=p.context_parallel_degree,
            tp=p.tensor_parallel_degree,
            world_size=world_size,
        )

    # ------------------------------------------------------------------ meshes

    def build_mesh(self, device_type: str) -> DeviceMesh:
        shape = (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)
        world = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)
        self._device_type = device_type
        self._meshes = {"world": world}
        self._meshes["dp_shard_cp"] = world["dp_shard", "cp"]._flatten("dp_shard_cp")
        self._meshes["loss"] = world["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
        return world

    def describe(self) -> str:
        active = [f"{n}={getattr(self, n)}" for n in MESH_DIMS if getattr(self, n) > 1]
        if self.ep > 1:
            active.append(f"ep={self.ep} (of dp_shard x cp x tp)")
        return "mesh " + (" x ".join(active) if active else "single device")

    @property
    def expert_fsdp_degree(self) -> int:
        """Ranks each expert-parallel slice of a MoE layer's experts is FSDP-sharded over."""
        return self.dp_shard * self.cp * self.tp // self.ep

    def moe_meshes(self) -> MoEMeshes:
        """The MoE layers' meshes (module docstring). Built on the first call, which every rank
        must make (it creates process groups)."""
        if "moe_world" not in self._meshes:
            shape = (self.pp, self.dp_replicate, self.expert_fsdp_degree, self.ep)
            names = ("pp", "dp_replicate", "efsdp", "ep")
            moe = init_device_mesh(self._device_type, shape, mesh_dim_names=names)
            self._meshes["moe_world"] = moe
            self._meshes["moe_dp"] = moe["efsdp", "ep"]._flatten("moe_dp")
            self._meshes["moe_tokens"] = moe["dp_replicate", "efsdp", "ep"]._flatten("moe_tokens")
        moe = self._meshes["moe_world"]
        replicated = self.dp_replicate > 1
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Slicing a flattened dim")
            return MoEMeshes(
                ep=moe["ep"],
                experts_fsdp=moe["dp_replicate", "efsdp"] if replicated else moe["efsdp"],
                dense_fsdp=moe["dp_replicate", "moe_dp"] if replicated else self._meshes["moe_dp"],
                tokens=self._meshes["moe_tokens"],
            )

    @property
    def world_mesh(self) -> DeviceMesh:
        return self._meshes["world"]

    def mesh(self, name: str) -> DeviceMesh:
        """A named dimension of the world mesh ("pp", "dp_replicate", "dp_shard", "cp", "tp")."""
        return self.world_mesh[name]

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        if self.dp_replicate == 1:
            return self._meshes["dp_shard_cp"]
        with warnings.catch_warnings():
            # Slicing a flattened dim from the root mesh is the documented way to get the 2-D
            # HSDP mesh on torch 2.11-2.13; the deprecation names no replacement yet.
            warnings.filterwarnings("ignore", message="Slicing a flattened dim")
            return self.world_mesh["dp_replicate", "dp_shard_cp"]

    @property
    def loss_mesh(self) -> DeviceMesh:
        return self._meshes["loss"]

    @property
    def dp_rank(self) -> int:
        w = self.world_mesh
        return w.get_local_rank("dp_replicate") * self.dp_shard + w.get_local_rank("dp_shard")


@dataclass(frozen=True)
class MoEMeshes:
    ep: DeviceMesh  # the ranks that exchange tokens and split a layer's experts
    experts_fsdp: DeviceMesh  # (dp_replicate,) efsdp: FSDP of each expert-parallel slice
    dense_fsdp: DeviceMesh  # (dp_replicate,) dp_shard x cp x tp: a MoE layer's other weights
    tokens: DeviceMesh  # every rank of the stage: where expert loads are summed


def _listing(degrees: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in degrees.items())
