"""DeepSeek-V3 as the composition sees it: Llama 3's layout and root plan, a tensor-parallel
plan for multi-head latent attention, the MoE blocks as Qwen3's, and what it cannot run under.

MLA under tensor + sequence parallelism. The latent down-projections (``wq_a``, ``wkv_a``) and
their RMSNorms keep replicated weights and run on each rank's sequence shard, like the
sequence-parallel norms; the up-projections (``wq``, ``wkv_b``) are column-wise (each rank its
heads) and all-gather their input's sequence, and the RoPE key is gathered at ``rope_key``.
So a block gathers the latents (kv_lora_rank + qk_rope_head_dim, and q_lora_rank wide: 2,112
for 236B and 671B) instead of the hidden states (5,120 / 7,168), and no rank computes another
rank's down-projection. Sharding the down-projections instead would split the latent each
RMSNorm normalises as a whole, and every head reads all of it: a collective per latent either
way, for matmuls that are a few percent of the block's. Without a query latent (16B) ``wq``
gathers the hidden states itself and the KV latent is gathered besides (2,048 + 576 wide).
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from torchtitan.models.common.family import ModelFamily
from torchtitan.models.deepseek_v3.args import DeepSeekV3Args
from torchtitan.models.deepseek_v3.flavors import MODEL_FLAVORS, model_args_from_config
from torchtitan.models.deepseek_v3.model import DeepSeekV3Transformer
from torchtitan.models.llama3.parallelize import LLAMA3, root_tp_plan
from torchtitan.models.llama3.parallelize import block_tp_plan as llama_block_tp_plan
from torchtitan.models.qwen3.parallelize import moe_block_tp_plan as qwen3_moe_block_tp_plan


class GatherSequence(ParallelStyle):
    """The module's first input, each rank's sequence shard (dim 1), all-gathered whole; its
    gradient, a partial sum on each rank (each uses it for its own heads), reduce-scattered."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def gather(_, inputs):
            shard = DTensor.from_local(inputs[0], device_mesh, [Shard(1)], run_check=False)
            whole = shard.redistribute(device_mesh, [Replicate()])
            return (whole.to_local(grad_placements=[Partial()]), *inputs[1:])

        module.register_forward_pre_hook(gather)
        return module


def _attention_plan() -> dict[str, ParallelStyle]:
    # Patterns, so one plan serves flavors with and without the query latent (wq_a, q_norm).
    return {
        "attention_norm": SequenceParallel(),
        # (hidden states, rope cache): the hidden states stay this rank's sequence shard.
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1), None),
            desired_input_layouts=(Shard(1), None),
            use_local_output=True,
        ),
        "attention.*_a": SequenceParallel(use_local_output=True),
        "attention.*_norm": SequenceParallel(use_local_output=True),
        "attention.wq": ColwiseParallel(input_layouts=Shard(1)),
        "attention.wkv_b": ColwiseParallel(input_layouts=Shard(1)),
        "attention.rope_key": GatherSequence(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    }


def block_tp_plan() -> dict[str, ParallelStyle]:
    """A dense block: MLA as above, the SwiGLU as Llama's."""
    ffn = {k: v for k, v in llama_block_tp_plan().items() if k.startswith(("ffn", "feed"))}
    return {**_attention_plan(), **ffn}


def moe_block_tp_plan() -> dict[str, ParallelStyle]:
    """MLA as above; the MoE layer runs on each rank's sequence shard, as in Qwen3."""
    moe = {k: v for k, v in qwen3_moe_block_tp_plan().items() if k.startswith(("ffn", "moe"))}
    return {**_attention_plan(), **moe}


def unsupported(args: DeepSeekV3Args, dims) -> str | None:
    """Why these dims cannot run this shape yet, or None."""
    if dims.cp > 1:
        return (
            "--parallelism.context_parallel_degree: deepseek_v3 does not run under context "
            "parallelism yet (its attention's values are narrower than its queries and keys, "
            "which our ring attention does not take): use FSDP, TP, PP or EP instead"
        )
    return None


DEEPSEEK_V3 = ModelFamily(
    name="deepseek_v3",
    model_class=DeepSeekV3Transformer,
    flavors=MODEL_FLAVORS,
    args_from_config=model_args_from_config,
    blocks_attr="layers",
    input_modules=LLAMA3.input_modules,
    output_modules=LLAMA3.output_modules,
    block_tp_plan=block_tp_plan,
    root_tp_plan=root_tp_plan,
    moe_block_tp_plan=moe_block_tp_plan,
    # The latent down-projections run replicated on sequence shards under TP, and are narrow.
    float8_exclude=("output", "router.gate", "attention.wq_a", "attention.wkv_a"),
    float8_tiled_cast=("attention.wq", "attention.wkv_b", "feed_forward.w1", "feed_forward.w3"),
    swiglu_attr="feed_forward",
    unsupported=unsupported,
)
