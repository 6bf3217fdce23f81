"""Activation checkpointing of transformer blocks: none, full, selective-op or every N-th block.

Selective-op ("op") policy: keep the outputs of the expensive ops (matmuls, float8 matmuls and
their amax reductions, attention kernels and the collectives tensor parallelism issues inside a
block) and recompute everything else (norms, RoPE, SwiGLU's pointwise ops, residual adds, float8
casts), which are memory-bound and cheap to redo.
With ``save_matmuls="alternate"`` only every other matmul of a block's forward is kept (the 1st,
3rd, ...): in a Llama block that recomputes wk, wo and w3 in backward, about 40% of the block's
saved activations for about 12% more matmul FLOPs per step (Llama 3 8B shapes).
"""

from __future__ import annotations

import contextlib
import importlib
from functools import partial

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from torchtitan.config import SaveMatmuls, choices
from torchtitan.parallel.blocks import replace_blocks

aten = torch.ops.aten


SAVE_MATMULS = choices(SaveMatmuls)
# torchao's float8 linears reach the policy as aten.mm on float8 tensor subclasses (eager and
# compiled, torch 2.13), so mm covers them; _scaled_mm, the float8 kernel, is kept where it
# reaches the policy directly.
_MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten._scaled_mm.default}
if hasattr(aten, "_grouped_mm"):  # MoE experts (torchtitan.models.common.moe)
    _MATMULS.add(aten._grouped_mm.default)
# The amax reductions of float8 casts: one value per tensor or per row, so keeping them costs
# nothing and spares the recompute a pass over the activation (and under TP an all-reduce).
_AMAX = {aten.max.default, aten.amax.default}


def _ops_to_save() -> set:
    ops = {
        *_MATMULS,
        *_AMAX,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
    }
    # FlexAttention and varlen attention (torchtitan.models.common.attention): their outputs
    # are as costly to recompute as SDPA's.
    flex = getattr(torch.ops.higher_order, "flex_attention", None)
    if flex is not None:
        ops.add(flex)
    with contextlib.suppress(ImportError):
        importlib.import_module("torch.nn.attention.varlen")  # registers the torch_attn ops
        ops.add(torch.ops.torch_attn._varlen_attn.default)
    functional = getattr(torch.ops, "_c10d_functional", None)
    if functional is not None:
        ops |= {
            functional.reduce_scatter_tensor.default,
            functional.all_reduce.default,
            # Expert parallel's token exchange: recomputing it would repeat the all-to-all.
            functional.all_to_all_single.default,
        }
    return ops


def _selective_policy(ops_to_save, alternate, matmul_counts, ctx, func, *args, **kwargs):
    if func not in ops_to_save:
        return CheckpointPolicy.PREFER_RECOMPUTE
    if alternate and func in _MATMULS:
        # The forward and its recompute each count from 1, so both see the same decisions.
        key = "recompute" if ctx.is_recompute else "forward"
        matmul_counts[key] += 1
        if matmul_counts[key] % 2 == 0:
            return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


def selective_op_context(save_matmuls: str = "all"):
    """A fresh pair of SAC contexts per forward (what ``context_fn`` must return)."""
    counts = {"forward": 0, "recompute": 0}
    policy = partial(_selective_policy, _ops_to_save(), save_matmuls == "alternate", counts)
    return create_selective_checkpoint_contexts(policy)


def _wrap(block: nn.Module, selective: bool, save_matmuls: str) -> nn.Module:
    if selective:
        context_fn = partial(selective_op_context, save_matmuls)
        return checkpoint_wrapper(block, context_fn=context_fn, preserve_rng_state=False)
    return checkpoint_wrapper(block, preserve_rng_state=False)


def _uses_selective_op_policy(mode: str, selective_ac_option: str) -> bool:
    return mode == "selective" and selective_ac_option == "op"


def checkpoints_whole_blocks(mode: str, selective_ac_option: str = "op") -> bool:
    """Whether ``apply_ac`` wraps blocks in plain (full) checkpointing: mode "full", or
    "selective" with every N-th block; not the selective-op policy."""
    return mode != "none" and not _uses_selective_op_policy(mode, selective_ac_option)


def _checkpoint_every(mode: str, selective_ac_option: str) -> int:
    """``apply_ac`` wraps every N-th block (mode not "none")."""
    if mode == "full" or _uses_selective_op_policy(mode, selective_ac_option):
        return 1
    return int(selective_ac_option)


def apply_ac(
    model: nn.Module,
    mode: str,
    selective_ac_option: str = "op",
    blocks_attr: str = "layers",
    save_matmuls: str = "all",
) -> None:
    """Wrap the model's blocks in place.

    mode "full" checkpoints every block; "selective" with option "op" applies the selective-op
    policy to every block (keeping ``save_matmuls``: "all" matmul outputs or every other,
    "alternate"), with option "N" fully checkpoints every N-th block.
    """
    if save_matmuls not in SAVE_MATMULS:
        raise ValueError(f"save_matmuls must be one of {SAVE_MATMULS}; got {save_matmuls!r}")
    if mode == "none":
        return
    selective_op = _uses_selective_op_policy(mode, selective_ac_option)
    wrap = partial(_wrap, selective=selective_op, save_matmuls=save_matmuls)
    replace_blocks(model, wrap, blocks_attr, _checkpoint_every(mode, selective_ac_option))
