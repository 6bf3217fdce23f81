#!/usr/bin/env bash
# Call 122 (one H200): which inductor kernels coordinate-descent tuning speeds up in a Float8
# block (1B at batch 4, the one-GPU trainer's fp32 parameters; 8B at batch 1 with FSDP's bf16
# parameters), and whether inductor's multi-kernel (persistent and looped reductions both
# compiled, the faster picked at run time) gets the same for less compile time; then the GPU
# tests of the code changed since call 120.
# Result: 1B 25.071 -> 24.810 ms tuned (multi-kernel 24.962), 8B 16.012 -> 15.809 ms; the gain
# spread over a dozen kernels; copy-in GPU tests 8 passed (docs/performance.md, finding 36).
source scripts/bench/lib.sh
card
SHOW=50
B1="--flavor 1B --batch 4 --iters 30 --top 50 --float8 --ac none"
B8="--flavor 8B --batch 1 --iters 30 --top 50 --float8 --ac none --params bfloat16"
T=100 fits 100 block_step f8_1b 0 ours $B1
T=200 fits 200 block_step f8_1b_tuned 0 ours $B1 --inductor coordinate_descent_tuning=1
T=100 fits 100 block_step f8_1b_mk 0 ours $B1 --inductor triton.multi_kernel=1
T=100 fits 100 block_step f8_8b 0 ours $B8
T=200 fits 200 block_step f8_8b_tuned 0 ours $B8 --inductor coordinate_descent_tuning=1
T=150 fits 150 gpu_test copy_in 0 tests/gpu/test_grad_copy_in_on_gpu.py
grep -E "losses|passed|failed|Error" $out/logs/copy_in.log | cut -c1-300
pack
