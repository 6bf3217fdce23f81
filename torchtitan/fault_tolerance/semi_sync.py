"""Semi-synchronous training: the replica groups take ``sync_every`` local steps alone, then
synchronize through torchft (no gradient exchange in between).

* ``local_sgd`` (``torchft.local_sgd.LocalSGD``): the weights are averaged.
* ``diloco`` (``torchft.local_sgd.DiLoCo``): each group's weight change since the last
  synchronization (the pseudo-gradient, old - new) is averaged and an outer SGD with Nesterov
  momentum steps the last synchronized weights with it. With ``fragments`` > 1 (streaming
  DiLoCo) the blocks are cut into that many contiguous fragments, synchronized in turn.

Both hook into the optimizer's step: the synchronization runs at the end of every
``sync_every``-th ``optimizer.step()``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from torchtitan.config import ConfigError, FaultTolerance
from torchtitan.parallel.blocks import block_items


def start_semi_sync(ft: FaultTolerance, manager, model: nn.Module, optimizer):
    """The entered LocalSGD or DiLoCo context of ``model`` (call ``__exit__`` at the end)."""
    from torchft.local_sgd import DiLoCo, LocalSGD

    if ft.semi_sync == "local_sgd":
        algorithm = LocalSGD(manager, model, optimizer, ft.sync_every)
    else:
        outer = torch.optim.SGD(
            model.parameters(), lr=ft.outer_lr, momentum=ft.outer_momentum, nesterov=True
        )
        algorithm = DiLoCo(
            manager, model_fragments(model, ft.fragments), optimizer, outer, ft.sync_every
        )
    return algorithm.__enter__()


def model_fragments(model: nn.Module, count: int) -> list[nn.Module]:
    """``model`` cut into ``count`` fragments of contiguous blocks; what comes before the
    blocks (embeddings) joins the first, what comes after (norm, head) the last."""
    if count == 1:
        return [model]
    blocks = [block for _, block in block_items(model)]
    if len(blocks) < count:
        raise ConfigError(
            f"--fault_tolerance.fragments {count} is more than the model's {len(blocks)} blocks"
        )
    fragments = [nn.ModuleList() for _ in range(count)]
    for index, block in enumerate(blocks):
        fragments[index * count // len(blocks)].append(block)
    before = True
    for name, child in model.named_children():
        if name == "layers":
            before = False
        elif any(True for _ in child.parameters()):
            fragments[0 if before else -1].append(child)
    return fragments
