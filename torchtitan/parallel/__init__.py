"""Parallelism helpers, each usable on any model with a container of repeated blocks.

apply_tp(model, tp_mesh, root_plan, block_plan, blocks_attr="layers")
apply_ac(model, mode, selective_ac_option="op", blocks_attr="layers")
apply_compile(model, blocks_attr="layers")
apply_float8(model, float8_config, fsdp_sharded=False)             # before all of them
apply_fsdp(model, mesh, param_dtype, reduce_dtype, reshard_policy, blocks_attr="layers")
parallelize_llama(model, parallel_dims, job_config, device_type)   # all of them, in order

Everything Llama-specific (names, TP plans, parallelize_llama) is in torchtitan.parallel.llama;
pipeline stages of any model come from torchtitan.parallel.pipeline.build_stage_module.
"""

from torchtitan.parallel.activation_checkpoint import apply_ac
from torchtitan.parallel.compile import apply_compile
from torchtitan.parallel.dims import ParallelDims
from torchtitan.parallel.float8 import apply_float8
from torchtitan.parallel.fsdp import apply_fsdp
from torchtitan.parallel.llama import llama_block_plan, llama_root_plan, parallelize_llama
from torchtitan.parallel.tensor_parallel import apply_tp

__all__ = [
    "ParallelDims",
    "apply_ac",
    "apply_compile",
    "apply_float8",
    "apply_fsdp",
    "apply_tp",
    "llama_block_plan",
    "llama_root_plan",
    "parallelize_llama",
]
