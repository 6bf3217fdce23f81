#!/usr/bin/env bash
# Call 79 (one H200): our rowwise float8 backward (the output gradient's column-wise cast in
# kernels of our own). Its GPU tests (the bits of torchao's cast; two linears against torchao's,
# eager and compiled), then one compiled 8B rowwise block under selective AC with FSDP's bf16
# parameters: ours, then with torchao's backward.
source scripts/bench/lib.sh
card
T=100 gpu_test gpu_rowwise 0 "tests/gpu/test_float8_cast_on_gpu.py -k wise_"
tail -3 $out/logs/gpu_rowwise.log
SHOW=14
R8="--flavor 8B --batch 1 --iters 30 --top 20 --params bfloat16 --float8 --recipe rowwise --ac selective"
T=90 fits 90 block_step 8b_rw_sac_ours 0 ours $R8
T=90 fits 90 block_step 8b_rw_sac_torchao 0 ours $R8 --torchao-backward
pack
