"""Access to a model's repeated blocks, the unit every ``apply_*`` helper works on.

Llama keeps them in ``model.layers`` (a ModuleDict); a custom model may use another attribute
and an ``nn.ModuleList``: pass its name as ``blocks_attr``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn


class BlockOnAnotherStage(nn.Module):
    """Stands in, in a pipeline stage's ``nn.ModuleList``, for a block another stage runs.

    It keeps the list's indices, and so the kept blocks' parameter names, those of the full
    model; it has no parameters and returns its first input, so a forward that loops over the
    list runs only this stage's blocks. The helpers skip it (``block_items``).
    """

    def forward(self, x, *args, **kwargs):
        return x


def block_items(model: nn.Module, blocks_attr: str = "layers") -> list[tuple[str | int, nn.Module]]:
    container = getattr(model, blocks_attr, None)
    if isinstance(container, nn.ModuleDict):
        return list(container.items())
    if isinstance(container, nn.ModuleList):
        return [(i, b) for i, b in enumerate(container) if not isinstance(b, BlockOnAnotherStage)]
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
