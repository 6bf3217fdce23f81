"""Qwen3 as the composition sees it: Llama 3's layout and TP plans, plus the per-head query and
key norms, the MoE router kept in high precision, and what it cannot run under yet."""

from __future__ import annotations

from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ParallelStyle,
    PrepareModuleInput,
    SequenceParallel,
)

from torchtitan.models.common.family import ModelFamily
from torchtitan.models.llama3.parallelize import LLAMA3, root_tp_plan
from torchtitan.models.llama3.parallelize import block_tp_plan as llama_block_tp_plan
from torchtitan.models.qwen3.args import Qwen3Args
from torchtitan.models.qwen3.flavors import MODEL_FLAVORS, model_args_from_config
from torchtitan.models.qwen3.model import Qwen3Transformer


def block_tp_plan() -> dict[str, ParallelStyle]:
    """Llama's block plan; the query/key norms act on each rank's own heads (dim 2 of
    (bs, seq, heads, head_dim)) with one replicated weight, whose gradient TP then sums."""
    plan = llama_block_tp_plan()
    for norm in ("attention.q_norm", "attention.k_norm"):
        plan[norm] = SequenceParallel(sequence_dim=2, use_local_output=True)
    return plan


def moe_block_tp_plan() -> dict[str, ParallelStyle]:
    """Attention as in a dense block; the MoE layer runs on each rank's own sequence shard
    (TP ranks are data-parallel ranks for it, see torchtitan.parallel.expert_parallel)."""
    plan = {k: v for k, v in block_tp_plan().items() if not k.startswith("feed_forward")}
    plan["moe"] = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=True
    )
    return plan


def unsupported(args: Qwen3Args, dims) -> str | None:
    """Why these dims cannot run this Qwen3 shape yet, or None."""
    if args.tie_embeddings and dims.pp > 1:
        return (
            "this Qwen3 flavor ties its embedding table to the head, which a pipeline split would "
            "put on two stages: use an untied flavor (8B and larger, the MoE ones) with "
            "--parallelism.pipeline_parallel_degree"
        )
    return None


QWEN3 = ModelFamily(
    name="qwen3",
    model_class=Qwen3Transformer,
    flavors=MODEL_FLAVORS,
    args_from_config=model_args_from_config,
    blocks_attr="layers",
    input_modules=LLAMA3.input_modules,
    output_modules=LLAMA3.output_modules,
    block_tp_plan=block_tp_plan,
    root_tp_plan=root_tp_plan,
    moe_block_tp_plan=moe_block_tp_plan,
    float8_exclude=("output", "router.gate"),
    float8_tiled_cast=LLAMA3.float8_tiled_cast,
    swiglu_attr="feed_forward",
    unsupported=unsupported,
)
