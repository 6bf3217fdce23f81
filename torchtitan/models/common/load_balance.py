"""Between-step expert load balancing for the MoE layers of a model.

After each optimizer step the trainer collects every layer's expert loads (one all-reduce over
the data-parallel group for all layers), nudges the selection biases from them, and logs the
worst imbalance and the auxiliary loss. Every rank sees the same reduced loads, so the biases
stay identical across ranks without being communicated themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from torchtitan.models.common.moe import MoE

# Wrapper segments that activation checkpointing and torch.compile add to module names.
_WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def moe_layers(model: nn.Module) -> list[tuple[str, MoE]]:
    """(FQN, module) of every MoE layer, in model order, wrapper segments removed."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, MoE):
            for seg in _WRAPPER_SEGMENTS:
                name = name.replace(seg, "")
            found.append((name, module))
    return found


def _modules(moes: Sequence[MoE] | Sequence[tuple[str, MoE]]) -> list[MoE]:
    return [m[1] if isinstance(m, tuple) else m for m in moes]


def _collective_device(moes: list[MoE], group: dist.ProcessGroup) -> torch.device:
    if moes:
        return moes[0].router.tokens_per_expert.device
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def collect_expert_loads(
    moes: Sequence[MoE] | Sequence[tuple[str, MoE]], group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """(layers, E) fp32 tokens routed to each expert since the last call, summed over ``group``
    (ranks holding the same layers) when given; resets the counters."""
    mods = _modules(moes)
    if not mods:
        return torch.zeros(0, 0, dtype=torch.float32)
    loads = torch.stack([m.router.tokens_per_expert for m in mods]).float()
    if group is not None:
        dist.all_reduce(loads, op=dist.ReduceOp.SUM, group=group)
    with torch.no_grad():
        for m in mods:
            m.router.tokens_per_expert.zero_()
    return loads


@torch.no_grad()
def update_expert_biases(
    moes: Sequence[MoE] | Sequence[tuple[str, MoE]], loads: torch.Tensor
) -> None:
    """Sign rule: an expert above its layer's mean load gets its selection bias lowered by
    ``bias_update_rate``, one below it raised; layers without ``balance_bias`` are left alone."""
    for m, load in zip(_modules(moes), loads, strict=True):
        if not m.args.balance_bias:
            continue
        load = load.to(m.router.expert_bias.device, torch.float32)
        m.router.expert_bias.add_(torch.sign(load.mean() - load), alpha=m.args.bias_update_rate)


def load_imbalance(loads: torch.Tensor) -> tuple[float, int]:
    """(max / mean tokens per expert of the worst layer, that layer's index); layers that saw
    no tokens are ignored, and (0.0, -1) when none did."""
    if loads.numel() == 0:
        return 0.0, -1
    loads = loads.detach().float()
    mean = loads.mean(dim=-1)
    ratio = torch.where(mean > 0, loads.amax(dim=-1) / mean.clamp_min(1e-30), 0.0)
    worst = int(ratio.argmax())
    if mean[worst] <= 0:
        return 0.0, -1
    return float(ratio[worst]), worst


def collect_aux_loss(
    moes: Sequence[MoE] | Sequence[tuple[str, MoE]], group: dist.ProcessGroup | None = None
) -> float | None:
    """Mean over layers of each layer's auxiliary loss (summed over the micro-batches since the
    last call), or None when no layer has it on; resets the sums. With ``group`` the mean runs
    over every such layer on every rank of it (one all-reduce, taken by every rank)."""
    mods = [m for m in _modules(moes) if m.args.aux_loss_coeff > 0]
    if group is None and not mods:
        return None
    if mods:
        total = torch.stack([m.router.aux_loss_sum for m in mods]).sum()
    else:
        total = torch.zeros((), dtype=torch.float32, device=_collective_device(mods, group))
    pair = torch.stack([total, torch.tensor(float(len(mods)), device=total.device)])
    if group is not None:
        dist.all_reduce(pair, op=dist.ReduceOp.SUM, group=group)
    with torch.no_grad():
        for m in mods:
            m.router.aux_loss_sum.zero_()
    total, count = pair.tolist()
    return total / count if count > 0 else None
