#!/usr/bin/env bash
# Call 109 (one H200): generation with the final code, for docs/generation.md: the GPU tests;
# scripts/bench/generate_speed.py (random weights, greedy, batch 1) for 8B and 1B, ours with the
# CUDA graph, ours --eager and transformers' generate, 512-token prompt and 256 new tokens; 8B
# after an 8,192-token prompt, graphed and eager. One capture stream per GPU now: the peak should
# no longer grow from run to run.
source scripts/bench/lib.sh
card
T=150 fits 150 gpu_test generate 0 tests/gpu/test_generate_on_gpu.py
grep -E "relative|graph vs|passed|failed|Error|tokens in" $out/logs/generate.log | cut -c1-200
T=120 fits 120 speed 8b --flavor 8B --prompt-tokens 512 --new-tokens 256
T=90 fits 90 speed 8b_eager --flavor 8B --prompt-tokens 512 --new-tokens 256 --impl ours --eager
T=90 fits 90 speed 1b --flavor 1B --prompt-tokens 512 --new-tokens 256
T=60 fits 60 speed 1b_eager --flavor 1B --prompt-tokens 512 --new-tokens 256 --impl ours --eager
T=90 fits 90 speed 8b_long --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours
T=90 fits 90 speed 8b_long_eager --flavor 8B --prompt-tokens 8192 --new-tokens 64 --impl ours --eager
pack
