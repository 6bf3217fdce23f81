"""Access to a model's repeated blocks, the unit every ``apply_*`` helper works on.

Llama keeps them in ``model.layers`` (a ModuleDict); a custom model may use another attribute
and an ``nn.ModuleList``: pass its name as ``blocks_attr``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn


def block_items(model: nn.Module, blocks_attr: str = "layers") -> list[tuple[str | int, nn.Module]]:
    container = getattr(model, blocks_attr, None)
    if isinstance(container, nn.ModuleDict):
        return list(container.items())
    if isinstance(container, nn.ModuleList):
        return list(enumerate(container))
    raise TypeError(
        f"{type(model).__name__}.{blocks_attr} must be an nn.ModuleDict or nn.ModuleList of "
        "blocks; pass blocks_attr= naming the attribute that holds them"
    )


def replace_blocks(
    model: nn.Module,
    transform: Callable[[nn.Module], nn.Module],
    blocks_attr: str = "layers",
    every: int = 1,
) -> None:
    """Replace every ``every``-th block with ``transform(block)``, in place."""
    container = getattr(model, blocks_attr)
    for i, (key, block) in enumerate(block_items(model, blocks_attr)):
        if i % every == 0:
            container[key] = transform(block)
