"""The trainer's side of Mixture-of-Experts load balancing, once per optimizer step.

Each MoE layer counts the tokens its router sent to each expert. Before the step commits the counts
of every rank that saw different tokens (data- and context-parallel ranks) are summed in one
all-reduce, and averaged over the live replica groups under fault tolerance (the sign rule of the
bias update is scale-free), so every rank updates its per-expert selection bias from the same loads
and the biases stay identical without being communicated. The step's load imbalance (max / mean
tokens per expert of the worst layer) and the auxiliary loss go to the metrics.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from torchtitan.models.common.load_balance import (
    collect_aux_loss,
    collect_expert_loads,
    moe_layers,
    update_expert_biases,
)

logger = logging.getLogger("torchtitan")


class ExpertBalance:
    """The MoE layers of this rank's model parts and what the trainer does with them per step.

    ``group``: the ranks whose tokens differ but whose layers are the same (data x context
    parallel of this pipeline stage), or None in one process. ``pp_group``: the pipeline ranks,
    whose layers differ (the worst layer is taken over all of them for the log; every pipeline
    rank must hold MoE layers, as a flavor with MoE in every block guarantees).
    ``forwards_per_step``: how often each layer runs per optimizer step (gradient accumulation x
    pipeline microbatches); the auxiliary loss of each forward is weighted by its inverse, as the
    training loss of a micro-batch is. ``across_replicas``: the mean of a tensor over the live
    replica groups (fault tolerance; identity without).
    """

    def __init__(
        self,
        model_parts: list[nn.Module],
        n_layers: int,
        forwards_per_step: int,
        group: dist.ProcessGroup | None = None,
        pp_group: dist.ProcessGroup | None = None,
        across_replicas: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.across_replicas = across_replicas or (lambda loads: loads)
        self.layers = [(name, moe) for part in model_parts for name, moe in moe_layers(part)]
        self.n_layers = n_layers  # of the whole model, whatever this stage holds
        self.group, self.pp_group = group, pp_group
        self.forwards_per_step = forwards_per_step
        for _, moe in self.layers:
            moe.aux_loss_weight = 1.0 / forwards_per_step

    @property
    def active(self) -> bool:
        return bool(self.layers)

    def describe(self) -> str:
        """One line for the log: what routing does (nothing is dropped)."""
        _, first = self.layers[0]
        a = first.args
        balance = "per-expert selection bias" if a.balance_bias else "no selection bias"
        aux = f"sequence aux loss x {a.aux_loss_coeff:g}" if a.aux_loss_coeff else "no aux loss"
        return (
            f"MoE: {len(self.layers)} layers on this rank, {a.num_experts} experts, top-{a.top_k}, "
            f"dropless (every token reaches all of its experts); {balance}; {aux}"
        )

    def collect_loads(self) -> torch.Tensor:
        """The step's expert loads (layers, experts), summed over ``group`` and averaged over
        the replica groups; resets the layers' counters."""
        loads = collect_expert_loads([moe for _, moe in self.layers], self.group)
        return self.across_replicas(loads)

    def after_step(self, loads: torch.Tensor, update_bias: bool) -> dict[str, torch.Tensor | float]:
        """Update the selection biases from ``loads`` (unless the step was skipped) and return
        the step's balance metrics."""
        moes = [moe for _, moe in self.layers]
        if update_bias:
            update_expert_biases(moes, loads)
        metrics = self._worst_layer(loads)
        # The same layers have it on on every rank; off, it costs no collective and no sync.
        with_aux = [moe for moe in moes if moe.args.aux_loss_coeff > 0]
        if with_aux:
            aux = self._over_stages(collect_aux_loss(with_aux, self.group), len(with_aux))
            metrics["moe_aux_loss"] = aux / self.forwards_per_step
        return metrics

    def _over_stages(self, mean: float, layers: int) -> float:
        """The mean over every pipeline stage's layers of a per-layer mean over this stage's."""
        if self.pp_group is None:
            return mean
        pair = torch.tensor(
            [mean * layers, float(layers)], device=self.layers[0][1].router.expert_bias.device
        )
        dist.all_reduce(pair, group=self.pp_group)
        return float(pair[0] / pair[1])

    def _worst_layer(self, loads: torch.Tensor) -> dict[str, torch.Tensor]:
        """max / mean tokens per expert of the worst layer of the whole model (all stages)."""
        per_layer = torch.zeros(self.n_layers, dtype=torch.float32, device=loads.device)
        index = torch.tensor([_layer_index(name) for name, _ in self.layers], device=loads.device)
        imbalance = loads.max(dim=1).values / loads.mean(dim=1).clamp_min(1e-9)
        per_layer.index_copy_(0, index, imbalance.float())
        if self.pp_group is not None:
            dist.all_reduce(per_layer, op=dist.ReduceOp.MAX, group=self.pp_group)
        # Device tensors: the metrics read them on log steps only (no host sync per step).
        return {"moe_load_imbalance": per_layer.max(), "moe_worst_layer": per_layer.argmax()}


def _layer_index(fqn: str) -> int:
    """The block index in a MoE layer's FQN (``layers.3.moe`` -> 3); blocks keep their index
    in every pipeline stage."""
    match = re.search(r"(?:^|\.)(\d+)(?:\.|$)", fqn)
    if match is None:
        raise ValueError(f"MoE layer {fqn} is not inside a numbered block")
    return int(match.group(1))
