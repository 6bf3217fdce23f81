#!/usr/bin/env bash
# Call 120 (one H200): call 118 again after the review fixes (the prompts pass in staged groups,
# mixed sequence seeds, the copy-in grid helper): the gradient copy-in and generation GPU tests.
# Result: 13 passed (copy-in 8, the same losses both ways; generation 5: 1.94 % and 31/31 for one
# sequence, 2.11 % and 90/93 for three; 10 sequences in 3 batches).
source scripts/bench/lib.sh
card
T=150 fits 150 gpu_test copy_in 0 tests/gpu/test_grad_copy_in_on_gpu.py
grep -E "losses|passed|failed|Error" $out/logs/copy_in.log | cut -c1-300
T=200 fits 200 gpu_test generate 0 tests/gpu/test_generate_on_gpu.py
grep -E "relative|graph vs|passed|failed|Error|tokens in|sequences in" $out/logs/generate.log | cut -c1-200
pack
