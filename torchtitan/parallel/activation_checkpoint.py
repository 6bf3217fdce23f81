"""Activation checkpointing of transformer blocks: none, full, selective-op or every N-th block.

Selective-op ("op") policy: keep the outputs of the expensive ops (matmuls, attention kernels and
the collectives tensor parallelism issues inside a block) and recompute everything else (norms,
RoPE, SwiGLU's pointwise ops, residual adds), which are memory-bound and cheap to redo.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from torchtitan.parallel.blocks import replace_blocks

aten = torch.ops.aten


def _ops_to_save() -> set:
    ops = {
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
    }
    functional = getattr(torch.ops, "_c10d_functional", None)
    if functional is not None:
        ops |= {functional.reduce_scatter_tensor.default, functional.all_reduce.default}
    return ops


def _selective_policy(ops_to_save, ctx, func, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if func in ops_to_save else CheckpointPolicy.PREFER_RECOMPUTE


def selective_op_context():
    """A fresh pair of SAC contexts per forward (what ``context_fn`` must return)."""
    return create_selective_checkpoint_contexts(partial(_selective_policy, _ops_to_save()))


def _wrap(block: nn.Module, selective: bool) -> nn.Module:
    if selective:
        return checkpoint_wrapper(block, context_fn=selective_op_context, preserve_rng_state=False)
    return checkpoint_wrapper(block, preserve_rng_state=False)


def apply_ac(
    model: nn.Module, mode: str, selective_ac_option: str = "op", blocks_attr: str = "layers"
) -> None:
    """Wrap the model's blocks in place.

    mode "full" checkpoints every block; "selective" with option "op" applies the selective-op
    policy to every block, with option "N" fully checkpoints every N-th block.
    """
    if mode == "none":
        return
    selective_op = mode == "selective" and selective_ac_option == "op"
    every = 1 if mode == "full" or selective_op else int(selective_ac_option)
    replace_blocks(model, partial(_wrap, selective=selective_op), blocks_attr, every)
