#!/usr/bin/env bash
# Call 93 (one H200): rowwise float8's column-wise cast with the scales computed inside the cast
# kernel (finding 33): the GPU float8 tests (bits against torchao's), then the 8B rowwise block
# under selective AC with bf16 parameters (as under FSDP), new against the eager scale math
# (--eager-column-scales), in the order A B B A on one GPU.
source scripts/bench/lib.sh
card
SHOW=14
T=240 gpu_test f8_gpu 0 tests/gpu/test_float8_cast_on_gpu.py
tail -3 $out/logs/f8_gpu.log
R8="--flavor 8B --batch 1 --iters 30 --top 20 --params bfloat16 --float8 --recipe rowwise --ac selective"
T=100 fits 100 block_step rw_new_a 0 ours $R8
T=100 fits 100 block_step rw_eager_a 0 ours $R8 --eager-column-scales
T=100 fits 100 block_step rw_eager_b 0 ours $R8 --eager-column-scales
T=100 fits 100 block_step rw_new_b 0 ours $R8
pack
