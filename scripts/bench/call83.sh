#!/usr/bin/env bash
# Call 83 (2x H200): checks after the copy-engine all-gather became the `auto` default and the
# column-wise cast kernels' block sizes changed: the float8 cast GPU tests (every kernel against
# torchao's bits), the copy-engine all-gather against NCCL's on both GPUs, and 8B FSDP2 bf16
# under selective AC with the defaults (the log must name the copy engines; call 82: 9,115).
source scripts/bench/lib.sh
card
T=200 gpu_test gpu_float8 0 "tests/gpu/test_float8_cast_on_gpu.py"
tail -2 $out/logs/gpu_float8.log | cut -c1-300
T=150 gpu_test gpu_copy_engines 0,1 "tests/gpu/test_copy_engine_all_gather.py"
tail -2 $out/logs/gpu_copy_engines.log | cut -c1-300
T=150 fits 150 ours fsdp2_default 0,1 $ROW_8K --compile.loss $SAC
grep -E "step:? +(10|20|30)[ /]" $out/logs/ours_fsdp2_default.log | sed 's/.*\(step\)/\1/' | cut -c1-150
grep -h "FSDP all-gather\|all-gathered by" $out/logs/ours_fsdp2_default.log | head -2 | cut -c1-200
pack
