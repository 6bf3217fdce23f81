#!/usr/bin/env bash
# Call 85 (one H200): float8_recompute.py's joint-graph pass, which makes the compiled backward
# recompute our float8 casts instead of the forward keeping them. The float8 GPU tests (the
# compiled linears now with the pass); then one compiled 8B block without AC, FSDP's bf16
# parameters: tensorwise with the pass and without it (--keep-float8-casts, the code before);
# rowwise with our input casts (now also without AC) and with torchao's (the code before).
source scripts/bench/lib.sh
card
T=150 fits 150 gpu_test gpu_float8 0 "tests/gpu/test_float8_cast_on_gpu.py"
tail -3 $out/logs/gpu_float8.log
SHOW=14
B8="--flavor 8B --batch 1 --iters 30 --top 20 --params bfloat16 --float8 --ac none"
T=95 fits 95 block_step tw_pass 0 ours $B8
T=95 fits 95 block_step tw_kept 0 ours $B8 --keep-float8-casts
T=95 fits 95 block_step rw_ours 0 ours $B8 --recipe rowwise
T=95 fits 95 block_step rw_torchao_input 0 ours $B8 --recipe rowwise --torchao-input-cast
pack
