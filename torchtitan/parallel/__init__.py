"""The parallelisms, each usable on any model with a container of repeated blocks, and the one
composition that applies them in order.

apply_tp(model, tp_mesh, root_plan, block_plan, blocks_attr="layers")
apply_ac(model, mode, selective_ac_option="op", blocks_attr="layers")
apply_compile(model, blocks_attr="layers")
apply_fsdp(model, mesh, param_dtype, reduce_dtype, reshard_policy, blocks_attr="layers")
parallelize(model, family, parallel_dims, job_config, device_type)   # all of them, in order

Pipeline stages of any model come from torchtitan.parallel.pipeline.build_stage_module; a model
family's declaration (where its parts live, its TP plans) is a
torchtitan.models.common.ModelFamily.
"""

from torchtitan.parallel.activation_checkpoint import apply_ac
from torchtitan.parallel.compile import apply_compile
from torchtitan.parallel.compose import parallelize
from torchtitan.parallel.dims import ParallelDims
from torchtitan.parallel.fsdp import apply_fsdp
from torchtitan.parallel.tensor_parallel import apply_tp

__all__ = [
    "ParallelDims",
    "apply_ac",
    "apply_compile",
    "apply_fsdp",
    "apply_tp",
    "parallelize",
]
