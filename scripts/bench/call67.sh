#!/usr/bin/env bash
# Call 67 (1 GPU): our tensorwise float8 backward, by variant, on one compiled block on GPU 0:
# torchao's backward (--torchao-backward), ours with every input cast fused by inductor
# (--tiled-cast with no FQN), ours as configured by default (norm-fed linears tiled), and every
# linear tiled; 8B (batch 1 x 8,192) with AC off and under our selective AC, 1B (batch 4). It ran
# an earlier form of the operator (held in the backward; docs/benchmarks.md, calls 66-70).
source scripts/bench/lib.sh
card
T=240 gpu_test float8_cast_test 0 tests/gpu/test_float8_cast_on_gpu.py
grep -E "passed|failed|relative|Error" $out/logs/float8_cast_test.log | tail -8
SHOW=9
ALL="attention.wq attention.wk attention.wv attention.wo feed_forward.w1 feed_forward.w2 feed_forward.w3"
# blk NAME ARGS...: our block on GPU 0
blk() { block_step $1 0 ours --iters 30 --top 60 "${@:2}"; }
B8="--float8 --flavor 8B --batch 1"
fits 50 blk 8b_torchao $B8 --torchao-backward
fits 50 blk 8b_fused $B8 --tiled-cast
fits 50 blk 8b_default $B8
fits 50 blk 8b_alltiled $B8 --tiled-cast $ALL
fits 50 blk 8b_sac_torchao $B8 --ac selective --torchao-backward
fits 50 blk 8b_sac_default $B8 --ac selective
fits 70 blk 1b_torchao --float8 --torchao-backward
fits 70 blk 1b_fused --float8 --tiled-cast
fits 70 blk 1b_default --float8
pack
