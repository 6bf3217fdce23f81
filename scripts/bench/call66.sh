#!/usr/bin/env bash
# Call 66 (1 GPU): our float8 backward with the tiled input cast against torchao's backward
# (block_step.py --torchao-backward): its GPU tests, then one compiled 8B block (batch 1 x 8,192)
# in the order A B B A and one 1B block (batch 4 x 8,192), on GPU 0. It ran an earlier form
# (every linear's input cast tiled, held in the backward; docs/benchmarks.md, calls 66-70).
source scripts/bench/lib.sh
card
T=240 gpu_test float8_cast_test 0 tests/gpu/test_float8_cast_on_gpu.py
grep -E "passed|failed|largest|Error" $out/logs/float8_cast_test.log | tail -8
SHOW=14
# blk NAME ARGS...: our block on GPU 0
blk() { block_step $1 0 ours --iters 30 --top 16 "${@:2}"; }
fits 60 blk f8_tiled --float8 --flavor 8B --batch 1
fits 60 blk f8_torchao --float8 --flavor 8B --batch 1 --torchao-backward
fits 60 blk f8_torchao_b --float8 --flavor 8B --batch 1 --torchao-backward
fits 60 blk f8_tiled_b --float8 --flavor 8B --batch 1
fits 80 blk f8_1b_tiled --float8
fits 80 blk f8_1b_torchao --float8 --torchao-backward
pack
