#!/usr/bin/env bash
# Call 118 (one H200): the GPU tests of this session's code once more on the final tree: the
# gradient copy-in (after the exact-casts rule) and generation (batches, top-p on the CPU path).
# Result: 10 passed (copy-in: the same losses both ways; generation: graph vs eager 1.94 % one
# sequence, 2.11 % and 90/93 argmax over three).
source scripts/bench/lib.sh
card
T=150 fits 150 gpu_test copy_in 0 tests/gpu/test_grad_copy_in_on_gpu.py
grep -E "losses|passed|failed|Error" $out/logs/copy_in.log | cut -c1-300
T=200 fits 200 gpu_test generate 0 tests/gpu/test_generate_on_gpu.py
grep -E "relative|graph vs|passed|failed|Error|tokens in|sequences in" $out/logs/generate.log | cut -c1-200
pack
