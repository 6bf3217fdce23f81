#!/usr/bin/env bash
# Call 80 (2x H200): rowwise float8 with the inputs' column-wise casts ours too (under AC). The
# GPU tests of the rowwise kernels and linears (GPU 0) beside a sweep of the column-wise cast
# kernels' block sizes (GPU 1); then one compiled 8B rowwise block under selective AC, the
# inputs cast by ours or by torchao's, on both GPUs at once and then swapped.
source scripts/bench/lib.sh
card
T=150 gpu_test gpu_rowwise 0 "tests/gpu/test_float8_cast_on_gpu.py -k wise_" &
(CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$site:$root timeout 240 python3 scripts/bench/column_cast_sweep.py \
  > $out/logs/sweep.log 2>&1; echo "sweep rc=$?") &
wait
tail -4 $out/logs/gpu_rowwise.log | cut -c1-300
grep -v -i warn $out/logs/sweep.log
SHOW=14
R8="--flavor 8B --batch 1 --iters 30 --top 20 --params bfloat16 --float8 --recipe rowwise --ac selective"
T=120 pair "block_step rw_inputs_g0 0 ours $R8" "block_step rw_torchao_inputs_g1 1 ours $R8 --torchao-input-cast"
T=120 pair "block_step rw_torchao_inputs_g0 0 ours $R8 --torchao-input-cast" "block_step rw_inputs_g1 1 ours $R8"
pack
