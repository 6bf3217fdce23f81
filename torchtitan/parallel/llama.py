"""Everything Llama-specific about parallelizing: module names, the TP/SP plans, and
``parallelize_llama``, the one composition the trainer calls.

The helpers it composes (``apply_tp``, ``apply_ac``, ``apply_compile``, ``apply_fsdp``) and the
pipeline split (``build_stage_module``) take the module names and plans as arguments (Llama's
names are their defaults).

Composition order: float8 linears (optional) -> TP/SP (+ loss parallel, async TP, float8 shard
scales) -> activation checkpointing -> per-block compile -> FSDP2 (or HSDP / DDP). Float8
conversion swaps modules, which the TP styles and FSDP then wrap. TP must come before the rest
because it replaces parameters with DTensors that AC, compile and FSDP then see; compile wraps
the checkpointed blocks (except whole-block checkpointing under TP, which goes around the
compiled block: see ``parallelize_llama``); FSDP wraps the compiled blocks, so its hooks stay
outside the compiled graphs. The caller then materializes (``to_empty``) and initializes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from torchtitan.dtypes import DTYPES
from torchtitan.parallel.activation_checkpoint import (
    apply_ac,
    checkpoints_whole_blocks,
)
from torchtitan.parallel.compile import apply_compile
from torchtitan.parallel.copy_engine_all_gather import local_gpus, uses_copy_engines
from torchtitan.parallel.float8 import (
    apply_float8,
    float8_tp_plan,
    float8_tp_styles,
    fuses_swiglu,
    recompute_must_round_like_forward,
    round_recompute_like_forward,
)
from torchtitan.parallel.float8_tp import scale_float8_by_shard, scales_tp_shards
from torchtitan.parallel.fsdp import apply_fsdp
from torchtitan.parallel.grad_copy_in import use_triton_grad_copy_in
from torchtitan.parallel.tensor_parallel import apply_tp, enable_async_tp
from torchtitan.parallel.vocab_parallel import VocabShardedHead

if TYPE_CHECKING:  # only annotations: keeps the config module free to import parallel/ modules
    from torchtitan.config import JobConfig
    from torchtitan.parallel.dims import ParallelDims

logger = logging.getLogger("torchtitan")

# Where torchtitan.models.llama3.Transformer keeps its parts (a pipeline stage drops the
# embedding on all but the first stage and the norm + head on all but the last).
LLAMA_BLOCKS = "layers"  # an nn.ModuleDict of TransformerBlock, keys "0".."n_layers-1"
LLAMA_INPUT_MODULES = ("tok_embeddings",)
LLAMA_OUTPUT_MODULES = ("norm", "output")


def llama_block_plan(float8: bool = False) -> dict[str, ParallelStyle]:
    """TP + SP for one TransformerBlock.

    Between blocks the activations are sharded on the sequence dimension (Shard(1)); each block
    all-gathers them before attention / the FFN (column-wise projections, local heads) and
    reduce-scatters after (row-wise projections). The norms run sequence-parallel. With
    ``float8`` (tensorwise float8 linears) torchao's styles cast each sub-layer's input to float8
    before the all-gather, so TP moves half the bytes.
    """
    colwise, rowwise, prepare_input = (
        float8_tp_styles() if float8 else (ColwiseParallel, RowwiseParallel, PrepareModuleInput)
    )
    return {
        "attention_norm": SequenceParallel(),
        # (hidden states, rope cache): gather the sequence, leave the rope cache alone.
        "attention": prepare_input(
            input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
        ),
        "attention.wq": colwise(),
        "attention.wk": colwise(),
        "attention.wv": colwise(),
        "attention.wo": rowwise(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": prepare_input(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": colwise(),
        "feed_forward.w3": colwise(),
        "feed_forward.w2": rowwise(output_layouts=Shard(1)),
    }


def llama_root_plan(
    loss_parallel: bool = True, fused_loss: bool = False
) -> dict[str, ParallelStyle]:
    """TP + SP for the embedding, final norm and head. With ``loss_parallel`` the head leaves the
    logits sharded on the vocabulary (Shard(-1)) so the loss is computed without gathering them.
    A fused loss head (``ChunkedLossHead``) computes its vocabulary shard's share of the loss
    itself: only its weight is sharded."""
    if fused_loss:
        head = VocabShardedHead()
    else:
        head = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": head,
    }


def copy_engines_chosen(choice: str, dims: ParallelDims) -> bool:
    """Whether FSDP's block all-gathers go to the copy engines (logged with the reason)."""
    chosen, why = uses_copy_engines(
        choice, dims.fsdp_degree, dims.tp, dims.cp, dims.pp, local_gpus()
    )
    logger.info("FSDP all-gather: %s (%s)", "copy engines" if chosen else "NCCL", why)
    return chosen


def parallelize_llama(model: nn.Module, dims: ParallelDims, cfg: JobConfig, device_type: str):
    """Apply every parallelism the config asks for to a (meta-device) Llama or pipeline stage
    of one, in place; returns the model."""
    p = cfg.parallelism
    ac = cfg.activation_checkpoint
    if cfg.float8.enable:  # first: TP styles and FSDP wrap the swapped-in Float8Linear modules
        apply_float8(model, cfg.float8, dims.fsdp_degree > 1)
        if fuses_swiglu(cfg.float8, dims.tp):
            from torchtitan.parallel.float8_swiglu import use_fused_swiglu  # imports torchao

            use_fused_swiglu(model, LLAMA_BLOCKS, "feed_forward")
    if dims.tp > 1:
        root_plan = llama_root_plan(
            not p.disable_loss_parallel, fused_loss=cfg.training.loss_chunk_tokens > 0
        )
        block_plan = llama_block_plan(float8_tp_plan(model, cfg.float8, device_type, LLAMA_BLOCKS))
        apply_tp(model, dims.mesh("tp"), root_plan, block_plan, LLAMA_BLOCKS)
        if scales_tp_shards(cfg.float8):
            scale_float8_by_shard(model, LLAMA_BLOCKS)
        if p.enable_async_tensor_parallel:
            enable_async_tp(dims.mesh("tp"))
    if recompute_must_round_like_forward(
        cfg.float8, cfg.compile.enable, ac.mode, ac.selective_ac_option
    ):
        round_recompute_like_forward()
    # torch 2.13 fails to run a compiled block that fully checkpoints DTensor ops ("expected all
    # tensors_saved_with_vc_check to be Tensors": the TP mesh the recompute needs is saved among
    # the tensors), so under TP full checkpointing wraps the compiled block instead.
    checkpoint_outside = (
        cfg.compile.enable
        and dims.tp > 1
        and checkpoints_whole_blocks(ac.mode, ac.selective_ac_option)
    )
    if not checkpoint_outside:
        apply_ac(model, ac.mode, ac.selective_ac_option, LLAMA_BLOCKS, ac.save_matmuls)
    if cfg.compile.enable:
        apply_compile(
            model,
            LLAMA_BLOCKS,
            clone_first_input=dims.tp > 1,
            in_place=checkpoint_outside,
            reorder_collectives=cfg.compile.reorder_collectives,
            tune_kernels=cfg.compile.tune_kernels,
        )
    if checkpoint_outside:
        apply_ac(model, ac.mode, ac.selective_ac_option, LLAMA_BLOCKS, ac.save_matmuls)
    if dims.data_parallel:
        on_gpu = device_type == "cuda"
        t = cfg.training
        triton = use_triton_grad_copy_in(on_gpu and p.fsdp_grad_copy_in == "triton")
        logger.info("FSDP gradient copy-in: %s", "Triton kernel" if triton else "FSDP's own")
        apply_fsdp(
            model,
            dims.fsdp_mesh,
            param_dtype=DTYPES[t.mixed_precision_param] if on_gpu else torch.float32,
            reduce_dtype=DTYPES[t.mixed_precision_reduce] if on_gpu else torch.float32,
            reshard_policy=p.fsdp_reshard_after_forward,
            pipeline_parallel=dims.pp > 1,
            blocks_attr=LLAMA_BLOCKS,
            input_group=LLAMA_INPUT_MODULES,
            output_group=LLAMA_OUTPUT_MODULES,
            embedding_rows_sharded=p.fsdp_sharded_embedding and dims.tp == 1,
            copy_engine_all_gather=on_gpu and copy_engines_chosen(p.fsdp_all_gather, dims),
        )
    return model
