"""Loading a Hugging Face checkpoint (safetensors) of a Llama 3, Qwen3 (dense or MoE) or
DeepSeek-V3 model into a model in any parallel layout."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import ModuleType

import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from torchtitan.checkpoint.consensus import Consensus
from torchtitan.models.deepseek_v3 import DeepSeekV3Args
from torchtitan.models.deepseek_v3 import hf as deepseek_v3_hf
from torchtitan.models.llama3 import ModelArgs
from torchtitan.models.llama3 import hf as llama3_hf
from torchtitan.models.llama3.hf import HFCheckpoint
from torchtitan.models.qwen3 import Qwen3Args
from torchtitan.models.qwen3 import hf as qwen3_hf

logger = logging.getLogger("torchtitan")


def hf_package(args: ModelArgs | Qwen3Args) -> ModuleType:
    """The ``hf`` package of ``args``' model family (``torchtitan.models.qwen3.hf`` for Qwen3,
    dense or MoE; ``deepseek_v3.hf``, ``llama3.hf``). They have the same functions."""
    if isinstance(args, DeepSeekV3Args):
        return deepseek_v3_hf
    return qwen3_hf if isinstance(args, Qwen3Args) else llama3_hf


def inspect_hf_checkpoint(
    hf_dir: str | Path, args: ModelArgs | Qwen3Args, strict: bool = True
) -> HFCheckpoint:
    """The family's ``inspect_hf_checkpoint``: config.json and the safetensors headers checked
    against ``args`` (one-line ValueError), no tensor data read."""
    return hf_package(args).inspect_hf_checkpoint(hf_dir, args, strict=strict)


def _model_keys(model: nn.Module) -> set[str]:
    # Local (sharded) state dict: no communication; FQNs without AC/compile/FSDP prefixes.
    return set(get_model_state_dict(model).keys())


def _check_parts(
    parts: list[nn.Module], args: ModelArgs | Qwen3Args, hf_dir: str | Path, consensus: Consensus
) -> None:
    """Every parameter each rank holds is one of the full model's, and every rank has the same
    number of parts (each makes one collective call per file and part); else a ValueError on
    every rank."""
    error = None
    hf = hf_package(args)
    held = set().union(*(_model_keys(part) for part in parts))
    if unknown := held - set(hf.expected_shapes(args)):
        error = f"model has parameter(s) that {hf_dir} cannot provide: {hf.few_names(unknown)}"
    gathered = consensus.gather((error, len(parts)))
    error = next((e for e, _ in gathered if e), None)
    counts = [n for _, n in gathered]
    if error is None and len(set(counts)) > 1:
        error = f"ranks pass different numbers of model parts to load_hf_weights: {counts}"
    if error:
        raise ValueError(error)


def load_hf_weights(
    model: nn.Module | list[nn.Module],
    hf_dir: str | Path,
    args: ModelArgs | Qwen3Args | None = None,
    strict: bool = True,
) -> None:
    """Load an HF Llama 3 or Qwen3 / Qwen3-MoE checkpoint (safetensors) into ``model`` in its
    current layout; the family is ``args``' (``hf_package``).

    Call it on every rank, after ``model.to_empty(...)`` and ``model.init_weights()`` (which also
    builds the RoPE cache). ``model`` may be plain, wrapped (AC, compile), sharded (FSDP2/TP
    DTensors of any mesh and placements, e.g. expert-parallel experts sharded on the expert
    dimension and FSDP-sharded again), a pipeline stage holding only some of the layers, or a
    list of such stages (the model parts of one rank; every rank must pass the same number). Rank
    0 reads the files one at a time and broadcasts each tensor; every rank keeps its own shard of
    the parameters it has (torch's ``set_model_state_dict`` slices the full tensor by each
    DTensor's own mesh and placements), so no rank holds more than one file of the checkpoint
    besides its own shards (and, for Qwen3-MoE, the experts of a layer split over two files).
    Qwen3-MoE routers' ``expert_bias`` (not in HF checkpoints) is set to zero.

    args: the full model's ModelArgs (default ``model.args``); the HF config must describe the
    same shapes and function. strict: also reject HF tensors that are not the model's.
    Every parameter the model holds must be in the checkpoint, strict or not. Problems raise a
    one-line ValueError on every rank.
    """
    start = time.perf_counter()
    parts = list(model) if isinstance(model, (list, tuple)) else [model]
    args = args if args is not None else parts[0].args
    consensus = Consensus()
    # Rank 0 alone needs to see the files; its verdict is shared, so that an error is raised on
    # every rank rather than leaving the others waiting in a broadcast.
    hf = hf_package(args)
    ckpt: HFCheckpoint = consensus.decide_on_rank0(
        lambda: hf.inspect_hf_checkpoint(hf_dir, args, strict=strict),
        raise_as=ValueError,
        catch=(ValueError,),
        verbatim=(ValueError,),
    )
    _check_parts(parts, args, hf_dir, consensus)
    # One call per file and part: strict=False because each call carries only that file's
    # tensors (the parameters it leaves out are copied onto themselves).
    options = StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=consensus.distributed, strict=False
    )
    tensors = 0
    # Rank 0 reads one state dict per file; the others receive into theirs.
    files = hf.read_hf_files(ckpt, args) if consensus.rank == 0 else ({} for _ in ckpt.files)
    for sd in files:
        tensors += len(sd)
        for part in parts:
            # set_model_state_dict may rename entries of the dict it is given: pass a copy
            set_model_state_dict(part, dict(sd), options=options)
    if consensus.rank == 0:
        logger.info(
            "loaded %d tensors from the Hugging Face checkpoint %s in %.2fs",
            tensors,
            hf_dir,
            time.perf_counter() - start,
        )
