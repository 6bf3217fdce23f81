"""The seed checkpoint: initial weights written by one process, which every layout starts from."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from torchtitan.checkpoint.folders import temporary
from torchtitan.config import ConfigError

logger = logging.getLogger("torchtitan")


def save_seed_checkpoint(model: nn.Module, path: str | Path) -> Path:
    """Write ``model``'s weights to a new DCP folder, atomically (temporary name, then rename).

    One process writes the full model; every layout then loads it (DCP reshards). Written to
    ``<folder>/step-0`` it is also what a run with ``checkpoint.enable`` starts from.
    """
    path = Path(path)
    if path.exists():
        raise ConfigError(
            f"seed checkpoint {path} already exists; remove it or choose another path"
        )
    tmp = temporary(path)
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.perf_counter()
    save_model_state(get_model_state_dict(model), tmp)
    tmp.rename(path)
    logger.info("seed checkpoint written to %s in %.1fs", path, time.perf_counter() - start)
    return path


def save_model_state(state_dict: dict[str, torch.Tensor], path: str | Path) -> None:
    """Write ``{"model": state_dict}`` to the DCP folder ``path`` from this process alone: the
    seed checkpoint's format, which ``--checkpoint.initial_load_path`` loads into any layout."""
    dcp.save({"model": state_dict}, checkpoint_id=str(path), no_dist=True)
