"""The dtype names users write (config options, script flags) and the torch dtypes they mean."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; a one-line ValueError for an unknown name."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype '{name}'; choose one of: {', '.join(DTYPES)}")
    return DTYPES[name]
