#!/usr/bin/env bash
# Call 108 (one H200): the graphed decode step with float32 sums from 16-bit inputs
# (torch.bmm's out_dtype) instead of float32 copies of the cache, which made call 107's 8B step
# 20 ms per token after an 8,192-token prompt (eager: 16). The GPU tests, then 8B at 512 and
# 8,192 prompt tokens, ours graphed; ours eager at 8,192 again for the same call.
source scripts/bench/lib.sh
card
T=150 fits 150 gpu_test generate 0 tests/gpu/test_generate_on_gpu.py
grep -E "relative|graph vs|passed|failed|Error|tokens in" $out/logs/generate.log | cut -c1-200
T=100 fits 100 speed 8b --flavor 8B --prompt-tokens 512 --new-tokens 256 --impl ours
T=100 fits 100 speed 8b_long --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours
T=100 fits 100 speed 8b_long_eager --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours --eager
T=100 fits 100 speed 1b --flavor 1B --prompt-tokens 512 --new-tokens 256 --impl ours
pack
