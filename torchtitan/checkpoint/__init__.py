"""Checkpoints through torch.distributed.checkpoint (DCP): save, resume, seed, export, HF weights.

One concern per module:

* ``manager``: ``CheckpointManager``, saving every ``interval`` steps and resuming with fallback;
* ``states``: what is saved (``TrainState`` and the model/optimizer/LR/data wrappers);
* ``folders``: ``step-<N>`` folders, written atomically (``.tmp``, then rename), kept to the newest
  K, found when complete (``complete_steps``, ``find_checkpoint``), a stale one moved aside (and
  the steps after an explicit ``load_step``, an abandoned branch);
* ``async_save``: background writes (staged in host memory, pinned on CUDA);
* ``space``: the size of a checkpoint, whether the disk holds what a run keeps (preflight), and
  the line a save that ran out of space ends with;
* ``safe_io``: reading without unpickling arbitrary objects (``SafeFileSystemReader``,
  ``SafeLoadPlanner``);
* ``consensus``: every rank takes the same decision and raises the same one-line error;
* ``resume_changes``: what changed since the checkpoint (training.steps, lr, batch, the
  optimizer's hyperparameters), logged once;
* ``seed``: the seed checkpoint every layout starts from;
* ``hf_load``: Hugging Face safetensors weights loaded into a model in any layout.

docs/checkpointing.md describes the on-disk layout, the rules and the API.
"""

import warnings

from torchtitan.checkpoint.errors import CheckpointError
from torchtitan.checkpoint.folders import (
    check_loadable,
    complete_steps,
    find_checkpoint,
    is_complete,
)
from torchtitan.checkpoint.manager import CheckpointManager
from torchtitan.checkpoint.safe_io import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    load_safely,
    read_metadata,
    read_state_names,
)
from torchtitan.checkpoint.seed import save_model_state, save_seed_checkpoint
from torchtitan.checkpoint.states import (
    LRSchedulerState,
    ModelState,
    OptimizerState,
    TrainState,
)

# DCP warns on every single-process save/load, even when asked for one (no_dist=True).
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninit")

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "LRSchedulerState",
    "ModelState",
    "OptimizerState",
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "TrainState",
    "check_loadable",
    "complete_steps",
    "find_checkpoint",
    "is_complete",
    "load_safely",
    "read_metadata",
    "read_state_names",
    "save_model_state",
    "save_seed_checkpoint",
]
