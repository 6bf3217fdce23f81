"""Regional compilation: ``torch.compile`` each transformer block on its own (fullgraph).

Blocks of one model share code and shapes, so the compiled graph is reused across them and the
compile cost is paid once; FSDP's hooks stay outside the compiled regions.
"""

from __future__ import annotations

import os
from functools import partial

import torch
import torch.nn as nn
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from torchtitan.parallel.blocks import block_items, replace_blocks

# Inductor's scheduler passes (torch >= 2.8) that issue each collective as early and wait for it
# as late as its data allows, each within a peak-memory budget (inductor's config_comms default:
# +20% of the graph's peak; 8B CP4's and FSDP2xTP2's measured peaks did not change).
OVERLAP_PASSES = (
    "reorder_communication_preserving_peak_memory",
    "sink_waits_iterative",
    "reorder_communication_preserving_peak_memory",
)


def reorder_collectives_for_overlap() -> None:
    """Process-wide: graphs compiled from now on overlap their collectives with computation
    (nothing turns it off again in the process; ``--compile.reorder_collectives false`` just
    does not call this).

    Without it the compiled backward of CP's ring attention waits for each K/V gradient
    exchange right after issuing it, before the next chunk's attention backward (seen in
    inductor's output code), so the exchange ran with no computation beside it.
    """
    import torch._inductor.config as inductor_config

    inductor_config.reorder_for_compute_comm_overlap = True
    inductor_config.reorder_for_compute_comm_overlap_passes = list(OVERLAP_PASSES)


def tune_kernels_by_coordinate_descent() -> None:
    """Process-wide: inductor benchmarks neighbouring block sizes of each Triton kernel it
    generates (norms, RoPE, SwiGLU, float8 casts, the loss) and keeps the fastest, instead of
    its heuristic's pick. Costs compile time (28 s on 1B, 42 s on 8B FSDP4, H200), not memory; the
    matmuls and attention are library kernels and unaffected. No effect on CPU code."""
    import torch._inductor.config as inductor_config

    inductor_config.coordinate_descent_tuning = True


def _compile(block: nn.Module, fullgraph: bool = True) -> nn.Module:
    return torch.compile(block, fullgraph=fullgraph)


def _compile_forward(block: nn.Module, fullgraph: bool = True) -> nn.Module:
    """Compile ``block.forward`` in place: the module keeps its class and parameter names, so a
    checkpoint wrapper around it reads as one around the plain block (DCP's names)."""
    block.forward = torch.compile(block.forward, fullgraph=fullgraph)
    return block


def _clone_tensor_inputs(module, args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def apply_compile(
    model: nn.Module,
    blocks_attr: str = "layers",
    clone_first_input: bool = False,
    in_place: bool = False,
    reorder_collectives: bool = False,
    tune_kernels: bool = False,
    fullgraph: bool = True,
) -> None:
    """Replace each block with its compiled wrapper, in place (``in_place``: compile each
    block's forward and keep the module, for a checkpoint wrapper to go around it).

    ``clone_first_input``: clone the first block's tensor inputs (eagerly, outside the compiled
    region). Needed under tensor parallelism: on torch 2.13 a compiled block that directly
    consumes a RowwiseParallel embedding's output fails in backward with "'Tensor' object has no
    attribute '_local_tensor'", and one eager op in between avoids it. The copy costs one
    activation (0.25 GiB for 1B at 4 x 8,192 tokens), so it is off otherwise.

    ``reorder_collectives``: see :func:`reorder_collectives_for_overlap`.
    ``tune_kernels``: see :func:`tune_kernels_by_coordinate_descent`.
    ``fullgraph``: False lets a block break its graph where it must run eagerly (the expert
    parallel token exchange).
    """
    if reorder_collectives:
        reorder_collectives_for_overlap()
    if tune_kernels:
        tune_kernels_by_coordinate_descent()
    compile_one = _compile_forward if in_place else _compile
    replace_blocks(model, partial(compile_one, fullgraph=fullgraph), blocks_attr)
    if clone_first_input:
        first = block_items(model, blocks_attr)[0][1]
        first.register_forward_pre_hook(_clone_tensor_inputs)


def use_per_rank_compile_cache(rank: int) -> None:
    """Give each rank its own inductor cache folder (``<TORCHINDUCTOR_CACHE_DIR>/rank_<r>``).

    A compiled graph that contains collectives names its process group, and ranks of different
    TP groups have different group names; the cache key does not include them (torch 2.13), so a
    cache shared by all ranks hands one rank another's graph on a warm start ("Could not resolve
    the process group registered under the name 15"). Each rank compiles anyway; the per-rank
    cache still makes re-runs warm.
    """
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    leaf = f"rank_{rank}"
    if os.path.basename(base) != leaf:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, leaf)
