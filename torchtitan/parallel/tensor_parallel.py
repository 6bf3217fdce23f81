"""Tensor + sequence parallelism for Llama, as a plan: module FQN -> ParallelStyle.

Between blocks the activations are sharded on the sequence dimension (Shard(1)); each block
all-gathers them before attention / the FFN (column-wise projections, local heads) and
reduce-scatters after (row-wise projections). The norms run sequence-parallel. The output head
leaves the logits sharded on the vocabulary (Shard(-1)) so the loss is computed without gathering
them (loss parallel).
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from torchtitan.parallel.blocks import block_items
from torchtitan.parallel.float8 import float8_tp_styles


def llama_block_plan(float8: bool = False) -> dict[str, ParallelStyle]:
    """With ``float8`` (tensorwise float8 linears), torchao's styles cast each sub-layer's input
    to float8 before the sequence all-gather, so TP moves half the bytes."""
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


def llama_root_plan(loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }


def apply_tp(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    root_plan: dict[str, ParallelStyle] | None = None,
    block_plan: dict[str, ParallelStyle] | None = None,
    blocks_attr: str = "layers",
) -> None:
    """Apply ``root_plan`` to ``model`` and ``block_plan`` to each block.

    Root-plan entries whose top-level module is absent (e.g. cut away by a pipeline split) are
    skipped; nested keys ("head.proj") and wildcards are passed on to ``parallelize_module``.
    Defaults: the Llama plans above, with loss parallel.
    """
    root_plan = llama_root_plan() if root_plan is None else root_plan
    block_plan = llama_block_plan() if block_plan is None else block_plan
    present = {
        k: v for k, v in root_plan.items() if getattr(model, k.split(".")[0], None) is not None
    }
    parallelize_module(model, tp_mesh, present)
    for _, block in block_items(model, blocks_attr):
        parallelize_module(block, tp_mesh, block_plan)


def check_tp_degree(n_heads: int, n_kv_heads: int, seq_len: int, tp: int) -> str | None:
    """A one-line reason why this model cannot use ``tp``, or None."""
    if n_heads % tp or n_kv_heads % tp:
        return (
            f"tensor_parallel_degree={tp} must divide n_heads={n_heads} and n_kv_heads={n_kv_heads}"
        )
    if seq_len % tp:
        return f"tensor_parallel_degree={tp} must divide training.seq_len={seq_len} (for SP)"
    return None


def enable_async_tp() -> None:
    """Let inductor overlap TP's all-gather/reduce-scatter with the matmuls (CUDA + compile)."""
    import torch._inductor.config as inductor_config

    # torch >= 2.11 allocates the symmetric memory it needs on demand.
    inductor_config._micro_pipeline_tp = True
