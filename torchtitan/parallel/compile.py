"""Regional compilation: ``torch.compile`` each transformer block on its own (fullgraph).

Blocks of one model share code and shapes, so the compiled graph is reused across them and the
compile cost is paid once; FSDP's hooks stay outside the compiled regions.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from torchtitan.parallel.blocks import replace_blocks


def _compile(block: nn.Module) -> nn.Module:
    return torch.compile(block, fullgraph=True)


def apply_compile(model: nn.Module, blocks_attr: str = "layers") -> None:
    """Replace each block with its compiled wrapper, in place."""
    replace_blocks(model, _compile, blocks_attr)
