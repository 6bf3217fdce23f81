#!/usr/bin/env bash
# Call 68 (1 GPU): the tiled cast without a dependency on the backward (without AC the compiled
# step casts each norm output once in the forward and keeps the float8 result; under AC it casts
# in the backward's recompute): its GPU tests, then one compiled block on GPU 0 against torchao's
# backward (8B batch 1, AC off and selective) and against the inductor-fused cast (1B batch 4).
source scripts/bench/lib.sh
card
T=240 gpu_test float8_cast_test 0 tests/gpu/test_float8_cast_on_gpu.py
grep -E "passed|failed|Error" $out/logs/float8_cast_test.log | tail -6
SHOW=8
# blk NAME ARGS...: our block on GPU 0
blk() { block_step $1 0 ours --iters 30 --top 60 "${@:2}"; }
B8="--float8 --flavor 8B --batch 1"
fits 50 blk 8b_default $B8
fits 50 blk 8b_torchao $B8 --torchao-backward
fits 50 blk 8b_sac_torchao $B8 --ac selective --torchao-backward
fits 50 blk 8b_sac_default $B8 --ac selective
fits 70 blk 1b_default --float8
fits 70 blk 1b_fused --float8 --tiled-cast
pack
