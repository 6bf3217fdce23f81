#!/usr/bin/env bash
# Call 110 (one H200): the GPU generation tests again after commit 521e4fd (the graphed step now
# calls Attention.rotated_qkv, shared with the model), and 8B/1B graphed speed as in call 109.
# Result: 3 passed (graph vs eager 1.94 %, 31/31 argmax); 8B 7.27-7.35 ms/token warm, 1B 2.31-2.32.
source scripts/bench/lib.sh
card
T=150 fits 150 gpu_test generate 0 tests/gpu/test_generate_on_gpu.py
grep -E "relative|graph vs|passed|failed|Error|tokens in" $out/logs/generate.log | cut -c1-200
T=120 fits 120 speed 8b --flavor 8B --prompt-tokens 512 --new-tokens 256 --impl ours
T=90 fits 90 speed 1b --flavor 1B --prompt-tokens 512 --new-tokens 256 --impl ours
pack
