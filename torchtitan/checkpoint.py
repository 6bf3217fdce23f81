"""Checkpoints through torch.distributed.checkpoint (DCP).

So far: the seed checkpoint — initial weights written once by one process — and loading model
weights from a DCP checkpoint into any parallel layout (DCP reshards on load).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from torchtitan.config import ConfigError

logger = logging.getLogger("torchtitan")


def save_seed_checkpoint(model: nn.Module, path: str | Path) -> Path:
    """Write ``model``'s weights to a new DCP folder, atomically (temporary name, then rename)."""
    path = Path(path)
    if path.exists():
        raise ConfigError(
            f"seed checkpoint {path} already exists; remove it or choose another path"
        )
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.perf_counter()
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(tmp), no_dist=True)
    tmp.rename(path)
    logger.info("seed checkpoint written to %s in %.1fs", path, time.perf_counter() - start)
    return path


def check_loadable(path: str | Path) -> None:
    """One-line error if ``path`` is not a complete DCP checkpoint."""
    if not (Path(path) / ".metadata").is_file():
        raise ConfigError(f"no complete DCP checkpoint at {path} (its .metadata file is missing)")


def load_model_weights(model: nn.Module, path: str | Path) -> None:
    """Load weights saved by any layout into ``model`` in its current (sharded) layout."""
    start = time.perf_counter()
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])
    logger.info("loaded model weights from %s in %.1fs", path, time.perf_counter() - start)
