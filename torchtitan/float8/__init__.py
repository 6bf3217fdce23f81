"""Float8 training through torchao: conversion and its checks, our tensorwise and rowwise
backward passes, FSDP's float8 all-gather cast, per-shard TP scales, and their kernels.

The composition (torchtitan.parallel.compose) calls ``apply_float8`` before TP and FSDP, then
``after_tensor_parallel`` and ``before_compile``; the trainer calls ``precompute_float8_scales``
before each step and hands ``plain_weights`` to the checkpointer. Nothing here imports torchao
until float8 is enabled.
"""

from torchtitan.float8.convert import (
    apply_float8,
    check_float8,
    plain_weights,
    precompute_float8_scales,
    recompute_must_round_like_forward,
    round_recompute_like_forward,
)
from torchtitan.float8.tp import scale_float8_by_shard, scales_tp_shards

__all__ = [
    "apply_float8",
    "check_float8",
    "plain_weights",
    "precompute_float8_scales",
    "recompute_must_round_like_forward",
    "round_recompute_like_forward",
    "scale_float8_by_shard",
    "scales_tp_shards",
]
