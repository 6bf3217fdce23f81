"""Llama 3 as the composition sees it: where its parts live and its tensor-parallel plans."""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from torchtitan.models.common.family import ModelFamily
from torchtitan.models.llama3.args import MODEL_FLAVORS, model_args_from_config
from torchtitan.models.llama3.model import Transformer


def block_tp_plan() -> dict[str, ParallelStyle]:
    """TP + SP for one TransformerBlock.

    Between blocks the activations are sharded on the sequence dimension (Shard(1)); each block
    all-gathers them before attention / the FFN (column-wise projections, local heads) and
    reduce-scatters after (row-wise projections). The norms run sequence-parallel.
    """
    return {
        "attention_norm": SequenceParallel(),
        # (hidden states, rope cache): gather the sequence, leave the rope cache alone.
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def root_tp_plan(loss_parallel: bool = True) -> dict[str, ParallelStyle]:
    """TP + SP for the embedding, final norm and head. With ``loss_parallel`` the head leaves the
    logits sharded on the vocabulary (Shard(-1)) so the loss is computed without gathering them."""
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }


LLAMA3 = ModelFamily(
    name="llama3",
    model_class=Transformer,
    flavors=MODEL_FLAVORS,
    args_from_config=model_args_from_config,
    blocks_attr="layers",
    input_modules=("tok_embeddings",),
    output_modules=("norm", "output"),
    block_tp_plan=block_tp_plan,
    root_tp_plan=root_tp_plan,
    float8_exclude=("output",),
    # The linears a norm feeds (docs/float8.md, "Our tensorwise backward").
    float8_tiled_cast=(
        "attention.wq",
        "attention.wk",
        "attention.wv",
        "feed_forward.w1",
        "feed_forward.w3",
    ),
    swiglu_attr="feed_forward",
)
