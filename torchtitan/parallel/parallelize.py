"""The one public composition: apply every parallelism to a (meta-device) Llama in the right order.

TP/SP (+ loss parallel, async TP) -> activation checkpointing -> per-block compile -> FSDP2 (or
HSDP / DDP).
TP must come first because it replaces parameters with DTensors that AC, compile and FSDP then
see; compile wraps the checkpointed blocks; FSDP wraps the compiled blocks, so its hooks stay
outside the compiled graphs. The caller then materializes (``to_empty``) and initializes.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from torchtitan.config import JobConfig
from torchtitan.parallel.activation_checkpoint import apply_ac
from torchtitan.parallel.compile import apply_compile
from torchtitan.parallel.dims import ParallelDims
from torchtitan.parallel.float8 import apply_float8, float8_tp_plan
from torchtitan.parallel.fsdp import apply_fsdp
from torchtitan.parallel.tensor_parallel import (
    apply_tp,
    enable_async_tp,
    llama_block_plan,
    llama_root_plan,
)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def parallelize_llama(model: nn.Module, dims: ParallelDims, cfg: JobConfig, device_type: str):
    p = cfg.parallelism
    if cfg.float8.enable:  # first: TP styles and FSDP wrap the swapped-in Float8Linear modules
        apply_float8(model, cfg.float8, fsdp_sharded=dims.fsdp_degree > 1)
    if dims.tp > 1:
        block_plan = llama_block_plan(float8=float8_tp_plan(model, cfg.float8, device_type))
        root_plan = llama_root_plan(not p.disable_loss_parallel)
        apply_tp(model, dims.mesh("tp"), root_plan=root_plan, block_plan=block_plan)
        if p.enable_async_tensor_parallel:
            enable_async_tp()
    ac = cfg.activation_checkpoint
    apply_ac(model, ac.mode, ac.selective_ac_option, save_matmuls=ac.save_matmuls)
    if cfg.compile.enable:
        apply_compile(model)
    if dims.data_parallel:
        on_gpu = device_type == "cuda"
        t = cfg.training
        apply_fsdp(
            model,
            dims.fsdp_mesh,
            param_dtype=DTYPES[t.mixed_precision_param] if on_gpu else torch.float32,
            reduce_dtype=DTYPES[t.mixed_precision_reduce] if on_gpu else torch.float32,
            reshard_policy=p.fsdp_reshard_after_forward,
            pipeline_parallel=dims.pp > 1,
        )
    return model
